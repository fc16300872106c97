"""The Gradio Blocks layout: a shared sampler panel, the Chat tab and the Race tab.

Every event that decodes goes through one queue (``concurrency_id="model"``, limit 1, or
max_batch when requests are batched): the model's decodes at a time, others see their queue
position. The instant steps
(submit, stop, undo, clear) run outside the queue so Stop works while the model is busy.
Element ids (stable, for automation) are listed in ``ELEMENT_IDS``.
"""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")   # before gradio is imported

import gradio as gr  # noqa: E402

from .chat import ChatHandlers, clean_history, session_of  # noqa: E402
from .idle import calm_queue  # noqa: E402
from .literal import literal_user_text  # noqa: E402
from ..serving.model import LONG_REPLY_PROMPT, ModelHost, describe_runtime  # noqa: E402
from ..serving.params import depth_choices  # noqa: E402
from .pictures import limits_text  # noqa: E402
from .race import DEFAULT_REPEATS, MAX_REPEATS, RaceHandlers  # noqa: E402
from .refusals import quiet_input_errors  # noqa: E402
from .render import esc  # noqa: E402
from ..serving.stops import StopRegistry  # noqa: E402

MODEL_QUEUE = dict(concurrency_id="model", concurrency_limit=1)


def model_queue(host) -> dict:
    """One decode at a time, or max_batch when requests are batched (webapp/serving/batching.py): the
    replies beyond that wait in Gradio's queue and see their position; those inside see
    "batched with N others" (webapp/ui/chat.py)."""
    return dict(MODEL_QUEUE, concurrency_limit=host.batch_width)
# Checks before a reply (submit, regenerate): through the queue, so a refusal shows its
# message as a toast (un-queued events show a bare "Error"), but never behind the model.
INSTANT = dict(queue=True, concurrency_id="instant", concurrency_limit=None, show_progress="hidden")
HISTORY_KEY = "mtp-chat-history"

ELEMENT_IDS = {
    "chat-input": "chat message box (textarea inside)",
    "chat-send": "send button",
    "chat-stop": "stop the reply being generated",
    "chatbot": "the conversation",
    "chat-regenerate": "regenerate the last reply",
    "chat-undo": "remove the last exchange",
    "chat-clear": "clear the conversation",
    "chat-mode": "MTP / AR switch",
    "system-prompt": "system prompt",
    "thinking": "reasoning switch (shown for templates with enable_thinking)",
    "race-prompt": "race prompt",
    "race-image": "race picture, optional (shown for checkpoints with a vision tower)",
    "race-repeats": "number of races (median speedup)",
    "race-start": "start the race",
    "race-stop": "stop the race",
    "race-lane-ar": "AR lane (left)",
    "race-lane-mtp": "MTP lane (right), tokens coloured by origin",
    "race-stats": "race statistics and speedup",
    "race-chart": "tokens over own-clock time",
    "race-json": "race figures as JSON",
    "temperature": "sampler: temperature", "top-p": "sampler: top_p", "top-k": "sampler: top_k",
    "min-p": "sampler: min_p", "max-tokens": "sampler: max tokens", "seed": "sampler: seed",
    "depth": "sampler: draft depth (1..N or auto)",
}

# The sampler sidebar starts open on desktops; on a phone it would cover the page.
CLOSE_SIDEBAR_ON_PHONES = """() => {
  if (window.innerWidth < 900) {
    const panel = document.querySelector('#sampler-panel.open');
    const button = panel && panel.querySelector('.toggle-button');
    if (button) button.click();
  }
}"""

RACE_PROMPT = LONG_REPLY_PROMPT


def build_app(host: ModelHost, *, runtime: str | None = None) -> gr.Blocks:
    s = host.settings
    stops = StopRegistry()
    chat = ChatHandlers(host, stops)
    race = RaceHandlers(host, stops)
    runtime = runtime if runtime is not None else describe_runtime()
    default_depth = str(s.depth)
    queue = model_queue(host)

    with gr.Blocks(title="mtp-chat", analytics_enabled=False, fill_width=True) as demo:
        demo.stops = stops   # for tests and the CLI
        gr.HTML(f"<div id='banner-body'><h3 style='margin:0 0 4px 0'>mtp-chat — multi-token-prediction "
                f"speculative decoding</h3><div class='mtp-banner'><b>Model:</b> {esc(host.description)}</div>"
                f"<div class='mtp-banner'><b>Runtime:</b> {esc(runtime)}</div>"
                f"<div class='mtp-banner'><b>Exactness:</b> {esc(host.exactness)}</div>"
                f"<div class='mtp-banner'><b>Memory:</b> {esc(host.memory)}</div></div>", elem_id="banner")
        saved = gr.BrowserState([], storage_key=HISTORY_KEY)

        with gr.Sidebar(label="Sampler", open=True, position="right", elem_id="sampler-panel"):
            gr.Markdown("**Sampler** — shared by Chat and Race")
            temperature = gr.Slider(0.0, 2.0, value=s.temperature, step=0.05, label="Temperature (0 = greedy)", elem_id="temperature")
            top_p = gr.Slider(0.0, 1.0, value=s.top_p, step=0.01, label="top_p (1 = off)", elem_id="top-p")
            top_k = gr.Slider(0, 200, value=s.top_k, step=1, label="top_k (0 = off)", elem_id="top-k")
            min_p = gr.Slider(0.0, 1.0, value=s.min_p, step=0.01, label="min_p (0 = off)", elem_id="min-p")
            max_tokens = gr.Number(value=s.max_tokens, precision=0, label="Max tokens", elem_id="max-tokens")
            seed = gr.Number(value=s.seed, precision=0, label="Seed", elem_id="seed")
            depth = gr.Dropdown(depth_choices(host.max_depth), value=default_depth if default_depth in depth_choices(host.max_depth) else "1",
                                label="Draft depth (MTP)", elem_id="depth",
                                info="'auto' lets the cost model pick, and turns MTP off where it does not pay")
        sampler = [temperature, top_p, top_k, min_p, max_tokens, seed, depth]

        with gr.Tabs(elem_id="tabs"):
            with gr.Tab("Chat", id="chat", elem_id="tab-chat"):
                with gr.Row(equal_height=True):
                    mode = gr.Radio([("MTP (speculative)", "mtp"), ("AR (plain)", "ar")], value="mtp",
                                    label="Decoding", elem_id="chat-mode", scale=1)
                    thinking = gr.Checkbox(True if s.thinking is None else bool(s.thinking), label="Thinking",
                                           info="the template's reasoning switch (enable_thinking)",
                                           visible=host.has_thinking, elem_id="thinking", scale=1)
                    with gr.Accordion("System prompt", open=False, elem_id="system-prompt-box"):
                        system = gr.Textbox("", lines=2, show_label=False, placeholder="You are a helpful assistant.",
                                            elem_id="system-prompt")
                chatbot = literal_user_text(gr.Chatbot(elem_id="chatbot", label="Conversation", height="58vh", min_height=280,
                                                       buttons=["copy", "copy_all"], layout="bubble",
                                                       placeholder="Ask something. Replies stream with their speed and "
                                                                   "MTP acceptance underneath."))
                with gr.Row(equal_height=True):
                    if chat.multimodal:   # paste, drop or pick pictures; without a tower no picture button at all
                        msg = gr.MultimodalTextbox(placeholder="Message, or paste / drop a picture (Enter to send)",
                                                   show_label=False, lines=1, max_lines=8, scale=6, elem_id="chat-input",
                                                   autofocus=True, file_types=["image"], file_count="multiple",
                                                   sources=["upload"], submit_btn=False,
                                                   info=f"Pictures: {limits_text(host)}")
                    else:
                        msg = gr.Textbox(placeholder="Message (Enter to send, Shift+Enter for a new line)",
                                         show_label=False, lines=1, max_lines=8, scale=6, elem_id="chat-input",
                                         autofocus=True)
                    send = gr.Button("Send", variant="primary", scale=1, min_width=80, elem_id="chat-send")
                    stop = gr.Button("Stop", variant="stop", scale=1, min_width=80, elem_id="chat-stop")
                with gr.Row():
                    regen = gr.Button("Regenerate", size="sm", min_width=90, elem_id="chat-regenerate")
                    undo = gr.Button("Undo", size="sm", min_width=70, elem_id="chat-undo")
                    clear = gr.Button("Clear", size="sm", min_width=70, elem_id="chat-clear")

            with gr.Tab("Race", id="race", elem_id="tab-race"):
                gr.Markdown("AR and MTP decode the same prompt with the same sampler and seed. The device is "
                            "time-shared: the lane whose own compute time is behind always goes next, so on "
                            "screen both have had the same compute time.")
                with gr.Row(equal_height=True):
                    race_prompt = gr.Textbox(RACE_PROMPT, lines=2, label="Prompt", scale=6, elem_id="race-prompt")
                    race_image = gr.Image(None, type="filepath", label="Picture (optional, both lanes)",
                                          sources=["upload", "clipboard"], visible=chat.multimodal, scale=2,
                                          height=140, elem_id="race-image")
                    repeats = gr.Number(DEFAULT_REPEATS, precision=0, minimum=1, maximum=MAX_REPEATS, label="Repeat N times", scale=1,
                                        min_width=100, elem_id="race-repeats")
                with gr.Row():
                    start = gr.Button("Start race", variant="primary", elem_id="race-start")
                    race_stop = gr.Button("Stop", variant="stop", elem_id="race-stop")
                empty = race.reset(default_depth)
                with gr.Row(equal_height=False, elem_id="race-lanes"):
                    lane_ar = gr.HTML(empty[0], elem_id="race-lane-ar", min_width=280)
                    lane_mtp = gr.HTML(empty[1], elem_id="race-lane-mtp", min_width=280)
                race_stats = gr.HTML("", elem_id="race-stats")
                race_chart = gr.HTML(empty[3], elem_id="race-chart")
                with gr.Accordion("Raw figures (JSON)", open=False):
                    race_json = gr.JSON({}, elem_id="race-json", show_label=False)

        # --- chat events ----------------------------------------------------------------
        respond_args = dict(fn=chat.respond, inputs=[chatbot, mode, system] + sampler + [thinking], outputs=chatbot,
                            show_progress="full", **queue)
        # Saves go through the queue, one at a time in the order they were asked for (as plain
        # requests two could be answered in the other order on a busy machine); a reply that Clear
        # or Undo took back saves nothing (chat.save_reply): their own save is the one that counts.
        save = dict(fn=lambda h: h, inputs=chatbot, outputs=saved, queue=True, concurrency_id="save",
                    concurrency_limit=1, show_progress="hidden", api_visibility="private")

        # .success: a refused message or regenerate queues no reply. The checks have no outputs
        # (a failed step covers its outputs, the whole conversation, with "Error").
        for reply in [
            gr.on([msg.submit, send.click], chat.check_message, msg, None, **INSTANT, api_visibility="private").success(
                chat.submit, [msg, chatbot], [msg, chatbot], queue=False, api_visibility="private").success(
                api_name="respond", **respond_args),
            gr.on([regen.click, chatbot.retry], chat.check_regenerate, chatbot, None, **INSTANT,
                  api_visibility="private").success(
                chat.prepare_regenerate, chatbot, chatbot, queue=False, api_visibility="private").success(
                api_visibility="private", **respond_args)]:
            reply.then(**{**save, "fn": chat.save_reply})
        # Undo and Clear withdraw the reply in flight (chat.take_back): it shows nothing more,
        # and `settle` puts their result back after the reply's last update.
        settle = dict(fn=chat.settle, inputs=None, outputs=chatbot, **INSTANT, api_visibility="private")
        gr.on([undo.click, chatbot.undo], chat.undo_and_stop, chatbot, [chatbot, msg], queue=False,
              api_visibility="private").then(**settle).then(**save)
        gr.on([clear.click], chat.clear_and_stop, None, [chatbot, msg], queue=False,
              api_visibility="private").then(**settle).then(**save)
        chatbot.clear(chat.withdraw, None, None, queue=False, api_visibility="private").then(
            **settle).then(**save)
        stop.click(chat.stop, None, None, queue=False, api_name="stop")

        # --- race events ----------------------------------------------------------------
        start.click(race.arm, None, start, queue=False, api_visibility="private").then(
            race.race, [race_prompt, repeats] + sampler + [race_image], [lane_ar, lane_mtp, race_stats, race_chart, race_json],
            api_name="race", show_progress="full", show_progress_on=[lane_ar, lane_mtp], **queue).then(
            lambda: gr.update(interactive=True), None, start, queue=False, api_visibility="private")
        race_stop.click(race.stop, None, None, queue=False, api_name="race_stop")

        # --- page life ------------------------------------------------------------------
        demo.load(lambda h: clean_history(h), saved, chatbot, queue=False, api_visibility="private")
        demo.load(None, js=CLOSE_SIDEBAR_ON_PHONES)

        def on_unload(request: gr.Request):   # tab closed: free the model and what the session left
            stops.stop_session(session_of(request))
            chat.forget(request)

        demo.unload(on_unload)
    calm_queue(demo)
    quiet_input_errors(demo)
    return demo


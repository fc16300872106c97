"""Pictures in the Chat and Race tabs' handlers (no browser): refusals in words, files only from
Gradio's upload folder, the race's picture in both lanes, the demo model refusing pictures."""
from __future__ import annotations

import uuid
from pathlib import Path

import gradio as gr
import pytest

from tests._pictures import VL, png
from tests._webapp_helpers import make_host
from webapp.ui.chat import ChatHandlers, clean_history, prompt_messages
from webapp.ui.pictures import upload_folder
from webapp.ui.race import RaceHandlers
from webapp.serving.stops import StopRegistry

SAMPLER = (0.0, 1.0, 0, 0.0, 8, 0, "2")   # temperature, top_p, top_k, min_p, max tokens, seed, depth


def uploaded(data: bytes, name: str = "picture.png") -> str:
    """A file where Gradio keeps what a browser uploads."""
    folder = upload_folder() / uuid.uuid4().hex
    folder.mkdir(parents=True)
    (folder / name).write_bytes(data)
    return str(folder / name)


@pytest.fixture(scope="module")
def host(tiny_checkpoint):
    return make_host(tiny_checkpoint(**VL), image_max_bytes=100_000, image_max_count=2)


@pytest.mark.parametrize("data, name, says", [
    (b"<svg xmlns='http://www.w3.org/2000/svg'/>", "a.svg", "SVG is not accepted"),
    (png(1)[:300], "a.png", "could not be decoded"),
    (png(1, width=400, height=400), "big.png", "at most 0.1 MB"),
])
def test_the_chat_refuses_a_bad_picture_saying_what_is_allowed(host, data, name, says):
    chat = ChatHandlers(host, StopRegistry())
    with pytest.raises(gr.Error) as e:
        chat.submit({"text": "What is it?", "files": [uploaded(data, name)]}, [])
    assert says in e.value.message and "up to 2 pictures a message" in e.value.message
    with pytest.raises(gr.Error, match="at most 2"):
        chat.submit({"text": "", "files": [uploaded(png(s)) for s in range(3)]}, [])
    box, history = chat.submit({"text": "What is it?", "files": [uploaded(png(1))]}, [])   # the next one goes
    assert box == {"text": "", "files": []} and history[-1]["content"][0]["type"] == "file"


def test_a_history_keeps_only_pictures_this_page_uploaded(host, tmp_path):
    mine, outside = uploaded(png(1)), tmp_path / "secret.png"
    outside.write_bytes(png(2))
    history = clean_history([{"role": "user", "content": [
        {"type": "file", "file": {"path": str(outside)}}, {"type": "file", "file": {"path": "/etc/passwd"}},
        {"type": "file", "file": {"path": str(Path(mine).parent / ".." / ".." / "etc" / "passwd")}},
        {"type": "file", "file": {"path": mine}}, {"type": "text", "text": "Hi"}]}])
    assert [b["file"]["path"] for b in history[0]["content"] if b["type"] == "file"] == [mine]
    msgs = prompt_messages(history, "", lambda p: p)
    assert [b["type"] for b in msgs[0]["content"]] == ["image", "text"]


def test_the_race_gives_both_lanes_the_same_picture(host):
    race = RaceHandlers(host, StopRegistry())
    *_, summary = list(race.race("Describe it.", 1, *SAMPLER, image=uploaded(png(1))))[-1]
    *_, plain = list(race.race("Describe it.", 1, *SAMPLER))[-1]
    assert summary["prompt_tokens"] - plain["prompt_tokens"] == 2 + 6   # vision start and end, 6 image tokens
    assert len(summary["runs"]) == 1
    with pytest.raises(gr.Error, match="not a file this page uploaded"):
        list(race.race("Describe it.", 1, *SAMPLER, image="/etc/passwd"))


def test_the_demo_model_has_no_tower_and_refuses_pictures():
    from core.settings import DEMO_MODEL_DIR

    demo = make_host(DEMO_MODEL_DIR)
    assert demo.adapter.vision is None and "text only (no vision tower)" in demo.description
    chat = ChatHandlers(demo, StopRegistry())
    assert chat.box("x") == "x"   # a plain text box: no picture button
    with pytest.raises(gr.Error, match="no vision tower"):
        chat.check_message({"text": "Hi", "files": [uploaded(png(1))]})

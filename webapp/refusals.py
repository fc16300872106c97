"""A request refused for bad input: the user reads why, the log gets one line.

Gradio prints a full traceback for every ``gr.Error`` (queueing.py, routes.py) unless it
was made with ``print_exception=False``. A refusal is not a crash, so it is logged here as
one warning line instead; real crashes keep their tracebacks.
"""
from __future__ import annotations

import logging

import gradio as gr

log = logging.getLogger("mtp_chat")


def refusal(message: str, title: str = "Invalid input", *, where: str = "request",
            warn: bool = False) -> gr.Error:
    """The ``gr.Error`` to raise for a refused request; logs it as one line. With ``warn``
    the page shows the message as a warning and the error itself stays invisible: a
    visible one also covers the event's outputs (the whole conversation) with "Error"."""
    log.warning("mtp-chat: refused %s: %s", where, " ".join(str(message).split()))
    if warn:
        gr.Warning(message, title=title)
    return gr.Error(message, title=title, print_exception=False, visible=not warn)


def quiet_input_errors(demo) -> None:
    """Gradio's own checks of a client's values (a slider's bounds, a dropdown's choices, a
    number that is not one) fail in the input component's preprocess, with a traceback:
    make them refusals too, on every input of ``demo``."""
    inputs = {id(b): b for fn in demo.fns.values() for b in fn.inputs}
    for component in inputs.values():
        name = getattr(component, "label", None) or getattr(component, "elem_id", None) or type(component).__name__
        component.preprocess = _refusing(component.preprocess, str(name))


def _refusing(preprocess, name: str):
    def checked(payload):
        try:
            return preprocess(payload)
        except gr.Error as exc:
            if not exc.print_exception:    # already a refusal
                raise
            raise refusal(f"{name}: {exc.message}", exc.title, where="input") from None
        except (TypeError, ValueError) as exc:   # a value of the wrong kind, from an API client
            shown = repr(payload)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise refusal(f"'{name}' cannot take {shown}: {exc}", "Invalid input", where="input") from None

    return checked

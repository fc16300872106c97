"""A request refused for bad input: the user reads why, the log gets one line.

Gradio prints a full traceback for every ``gr.Error`` (queueing.py, routes.py) unless it
was made with ``print_exception=False``. A refusal is not a crash, so it is logged here as
one warning line instead; real crashes keep their tracebacks.
"""
from __future__ import annotations

import logging

import gradio as gr
from pydantic import ValidationError

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
    number that is not one, a history not shaped as messages) fail in the input component's
    data model or preprocess, with a traceback: make them refusals too, on every input of
    ``demo``."""
    inputs = {id(b): b for fn in demo.fns.values() for b in fn.inputs}
    for component in inputs.values():
        name = str(getattr(component, "label", None) or getattr(component, "elem_id", None)
                   or type(component).__name__)
        component.preprocess = _refusing(component.preprocess, name)
        if getattr(component, "data_model", None) is not None:
            component.data_model = _refusing_model(component.data_model, name)


def _refusing_model(model, name: str):
    """``model`` whose validation failure is a refusal (same name: the API schema is unchanged)."""
    def model_validate(cls, obj, **kwargs):
        try:
            return model.model_validate.__func__(cls, obj, **kwargs)
        except ValidationError as exc:
            first = exc.errors()[0] if exc.errors() else {}
            where = ".".join(str(p) for p in first.get("loc", ())) or "value"
            raise refusal(f"'{name}' is not in the expected shape: at {where}: {first.get('msg', exc)}.",
                          "Invalid input", where="input") from None

    return type(model.__name__, (model,), {"model_validate": classmethod(model_validate),
                                           "__module__": model.__module__})


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

"""How the app looks and greets: its Gradio theme and the sign-in message (used by page.py to
build the page and by server.py to mount it; apart so that neither imports the other)."""
from __future__ import annotations

import gradio as gr

THEME = gr.themes.Soft(
    font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "sans-serif"],      # no web fonts: offline
    font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"],
)

AUTH_MESSAGE = "mtp-chat: sign in with the user and password the host gave you."

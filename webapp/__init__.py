"""mtp-chat's web app (Gradio): chat, a fair AR-vs-MTP race, an HTTP API, and the `mtp-chat` command.

By job: ui/ (the Gradio page), api/ (the OpenAI, Responses and Anthropic HTTP APIs), serving/
(the model host and its one model thread, under both). At the top: the command (cli.py,
__main__.py, attach_head.py), the server that mounts the page and the API on one port
(server.py: the composition root, the one module that imports both ui and api), and netinfo.py
(host and address checks, a leaf any package may import).

Arrows point down only: server/cli -> {ui, api} -> serving -> {core, adapters} -> mlx.
"""
# A fast BLAS must be loaded before anything imports mlx.core; importing `adapters` does it
# first thing (adapters/runtime.py), so every way into the web app gets it.
import adapters  # noqa: F401

"""mtp-chat's web app (Gradio): chat, a fair AR-vs-MTP race, an HTTP API, and the `mtp-chat` command.

By job: ui/ (the Gradio page), api/ (the OpenAI, Responses and Anthropic HTTP APIs), serving/
(the model host and its one model thread, under both). At the top: the command (cli.py,
__main__.py, attach_head.py), the server that mounts the page and the API on one port
(server.py), and netinfo.py (host and address checks, a leaf any package may import). cli.py
and server.py are the composition root: the only modules that import both ui and api.

Arrows point down only: server/cli -> {ui, api} -> serving -> {core, adapters} -> mlx.
"""
# A fast BLAS must be loaded before anything imports mlx.core; importing `adapters` does it
# first thing (adapters/runtime.py), so every way into the web app gets it.
import adapters  # noqa: F401

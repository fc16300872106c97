"""mtp-chat's web app (Gradio): chat, a fair AR-vs-MTP race, and the `mtp-chat` command."""
# A fast BLAS must be loaded before anything imports mlx.core; importing `adapters` does it
# first thing (adapters/runtime.py), so every way into the web app gets it.
import adapters  # noqa: F401

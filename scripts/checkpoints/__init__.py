"""Checkpoints for tests and probes, and tools that read real ones (docs/checkpoint-layout.md).

Makers: make_tiny_checkpoint.py (every Qwen family, the Qwythos layout; the tests' fixture),
tiny_gemma4.py (a Gemma 4 backbone and its drafter), tiny_vision.py (Qwen3.5's vision tower);
what they share is in tokenizer_files.py (tokens, chat templates, the BPE) and shards.py (the
trunk's safetensors), so that no maker imports another for it.
Inspectors: inspect_model.py, inspect_mtp_weights.py, check_gemma4_drafter.py.

May import adapters and core; nothing from webapp or the other script packages.
"""

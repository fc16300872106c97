"""Family-independent checkpoint checks: where it is, and what its config.json says."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Tuple, Union

from .errors import CheckpointError


def resolve(path_or_id: Union[str, Path]) -> Path:
    """A local directory, or a Hugging Face id only when it is already in the local cache."""
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{path} is a file: give the checkpoint directory (the one holding config.json).")
    text = str(path_or_id)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(text, local_files_only=True))
        except Exception:
            pass
    raise CheckpointError(
        f"No checkpoint directory at '{path_or_id}'. Give the path of a local copy of the model "
        "(the directory with config.json and optiq/mtp.safetensors); Hugging Face ids work only "
        "when the model is already in the local cache, nothing is downloaded."
    )


def read_config(path: Path) -> dict:
    cfg = path / "config.json"
    if not cfg.is_file():
        raise CheckpointError(f"{path} has no config.json: it is not a model checkpoint directory.")
    try:
        config = json.loads(cfg.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{cfg} is not valid JSON ({exc}).") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise CheckpointError(f"{cfg} has no model_type: cannot tell which model family this is.")
    return config


def open_checkpoint(path_or_id: Union[str, Path]) -> Tuple[Path, dict]:
    """The checkpoint directory and its config.json, or a CheckpointError saying what is wrong."""
    ckpt = resolve(path_or_id)
    return ckpt, read_config(ckpt)


def text_config(config: dict) -> dict:
    """The language-model part of a (possibly multimodal) config."""
    return config.get("text_config", config)

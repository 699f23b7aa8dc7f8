"""Model checkpoints: weights in safetensors, configuration and metadata in its header.

Files are written to a temporary name in the same folder and renamed, so a checkpoint is
either the old one or the new one, never half-written.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from spe.models.config import ModelConfig
from spe.models.decoder_lm import DecoderLM

__all__ = ["MODEL_FILE", "atomic_write", "load", "load_metadata", "save"]

MODEL_FILE = "model.safetensors"


def atomic_write(path: str | os.PathLike, write) -> None:
    """Calls ``write(tmp_path)`` then renames tmp_path to ``path`` (same folder, atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _resolve(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path} (expected a {MODEL_FILE} file or a folder holding one)")
    return path


def save(model: DecoderLM, path: str | os.PathLike, *, metadata: dict | None = None) -> Path:
    """Writes the model's weights and configuration atomically.

    Args:
        model: the model.
        path: a ``.safetensors`` file, or a folder (then ``folder/model.safetensors``).
        metadata: JSON-serialisable extras (e.g. the tokenizer's parameters, training step).

    Returns:
        The file written.
    """
    from safetensors.torch import save_file

    path = Path(path)
    if path.suffix != ".safetensors":
        path = path / MODEL_FILE
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        state.pop("head.weight", None)  # the same tensor as embed.weight
    header = {"spe_config": json.dumps(model.config.to_dict()), "spe_metadata": json.dumps(metadata or {})}
    atomic_write(path, lambda tmp: save_file(state, tmp, metadata=header))
    return path


def load_metadata(path: str | os.PathLike) -> dict:
    """Returns the metadata dict stored by :func:`save` (plus ``config``)."""
    from safetensors import safe_open

    file = _resolve(path)
    try:
        with safe_open(str(file), framework="pt") as f:
            header = f.metadata() or {}
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types
        raise ValueError(f"{file} is not a readable safetensors file: {err}") from None
    if "spe_config" not in header:
        raise ValueError(f"{file} is not an spe checkpoint (no spe_config in its header)")
    meta = json.loads(header.get("spe_metadata", "{}"))
    meta["config"] = json.loads(header["spe_config"])
    return meta


def load(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> DecoderLM:
    """Loads a model saved by :func:`save`, in eval mode.

    Args:
        path: the ``.safetensors`` file or the folder holding ``model.safetensors``.
        device: where to put the weights.

    Returns:
        A :class:`~spe.DecoderLM`; ``model(tokens)`` maps (batch, length) ids to
        (batch, length, vocab_size) logits.

    Raises:
        FileNotFoundError: if there is no checkpoint there.
        ValueError: if the file is not an spe checkpoint or its tensors do not fit the config.
    """
    from safetensors.torch import load_file

    file = _resolve(path)
    config = ModelConfig.from_dict(load_metadata(file)["config"])
    model = DecoderLM(config)
    state = load_file(str(file))
    if config.tie_embeddings:
        state["head.weight"] = state["embed.weight"]
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"{file}: tensors do not match its configuration: {err}") from None
    return model.to(device).eval()

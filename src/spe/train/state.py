"""Crash-safe checkpoints of a training run: the last K kept, every random state saved.

A run folder ``out`` holds

* ``checkpoints/step-SSSSSSS/`` for the last ``keep`` checkpoints, each with ``train_state.pt``
  (written first) and ``model.safetensors`` (written last: its presence marks the folder
  complete);
* ``out/model.safetensors`` and ``out/train_state.pt``: the latest of them (hard links, or
  copies where links are impossible), so every reader of a run folder keeps working.

Every file is written to a temporary name, flushed, renamed and its folder flushed
(:func:`spe.checkpoint.atomic_write`), so a ``SIGKILL`` or a power cut at any moment leaves
the previous checkpoint intact. :func:`latest_checkpoint` finds the newest complete one and
:func:`repair_run_folder` points the run folder's files back at it.

The training state holds what resuming needs to continue the same trajectory: the optimizer
(and the fp16 gradient scaler), the step (the learning-rate schedule is a function of it),
the run's generators (crop order, SPE codes, feature redraws) and, for every process, the
global random states (torch CPU and CUDA, Python ``random``, NumPy).
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from spe.checkpoint import MODEL_FILE, TRAIN_STATE_FILE, atomic_write, fsync_dir, load_metadata, save

__all__ = ["CHECKPOINTS_DIR", "STATE_FORMAT_VERSION", "global_rng_states", "latest_checkpoint",
           "load_train_state", "repair_run_folder", "restore_global_rng", "save_checkpoint"]

CHECKPOINTS_DIR = "checkpoints"
# Version of train_state.pt's layout; states without one were written before it (version 0).
STATE_FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"step-(\d+)$")


def global_rng_states() -> dict:
    """This process's global random states: torch CPU (dropout), CUDA, Python ``random``, NumPy."""
    states = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_global_rng(states: dict) -> None:
    """Restores :func:`global_rng_states` output (CUDA states only where CUDA is in use)."""
    torch.set_rng_state(states["torch"])
    if "python" in states:
        random.setstate(states["python"])
    if "numpy" in states:
        np.random.set_state(states["numpy"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _step_dirs(out: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint folder, newest first."""
    root = out / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        match = _STEP_DIR.match(d.name)
        if match and (d / MODEL_FILE).is_file() and (d / TRAIN_STATE_FILE).is_file():
            found.append((int(match.group(1)), d))
    return sorted(found, reverse=True)


def latest_checkpoint(out: str | os.PathLike) -> Path | None:
    """The folder of the newest complete checkpoint of a run (None if there is none).

    Runs written before checkpoints were kept have no ``checkpoints/`` folder: then the run
    folder itself, if it holds a model.
    """
    out = Path(out)
    dirs = _step_dirs(out)
    if dirs:
        return dirs[0][1]
    return out if (out / MODEL_FILE).is_file() else None


def _link(source: Path, target: Path) -> None:
    """Atomically makes ``target`` the same content as ``source`` (a hard link where possible)."""
    def write(tmp: str) -> None:
        os.unlink(tmp)
        try:
            os.link(source, tmp)
        except OSError:  # another file system, or links not supported
            shutil.copyfile(source, tmp)

    atomic_write(target, write)


def repair_run_folder(out: str | os.PathLike) -> int | None:
    """Points ``out/model.safetensors`` and ``out/train_state.pt`` at the newest complete checkpoint.

    After a crash between the two renames of :func:`save_checkpoint`, the run folder's pair
    can be from two steps (or the model missing); this restores a matching pair. Returns the
    step of the newest checkpoint (None if there is none).
    """
    out = Path(out)
    dirs = _step_dirs(out)
    if not dirs:
        return None
    step, newest = dirs[0]
    current = load_metadata(out).get("step") if (out / MODEL_FILE).is_file() else None
    if current != step or not (out / TRAIN_STATE_FILE).is_file() or \
            not os.path.samefile(out / TRAIN_STATE_FILE, newest / TRAIN_STATE_FILE):
        _link(newest / TRAIN_STATE_FILE, out / TRAIN_STATE_FILE)
        _link(newest / MODEL_FILE, out / MODEL_FILE)
    return step


def save_checkpoint(out: Path, model, state: dict, *, step: int, metadata: dict, keep: int) -> Path:
    """Writes ``checkpoints/step-SSSSSSS/`` (state, then model), links the run folder to it, keeps ``keep``.

    Args:
        out: the run folder.
        model: the (unwrapped) model whose weights are saved in float32 as they are.
        state: the training state (see :func:`load_train_state`), with ``step``.
        step: the optimizer step.
        metadata: the model header's metadata.
        keep: how many checkpoint folders to keep (the newest).

    Returns:
        The checkpoint folder.
    """
    folder = out / CHECKPOINTS_DIR / f"step-{step:07d}"
    folder.mkdir(parents=True, exist_ok=True)
    fsync_dir(folder.parent)
    stamped = {**state, "step": step, "format_version": STATE_FORMAT_VERSION}
    atomic_write(folder / TRAIN_STATE_FILE, lambda tmp: torch.save(stamped, tmp))
    save(model, folder, metadata=metadata)
    _link(folder / TRAIN_STATE_FILE, out / TRAIN_STATE_FILE)
    _link(folder / MODEL_FILE, out / MODEL_FILE)
    for _, old in _step_dirs(out)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def load_train_state(folder: Path) -> dict:
    """Reads ``folder/train_state.pt``.

    Raises:
        ValueError: if it cannot be read or was written by a newer spe.
    """
    file = folder / TRAIN_STATE_FILE
    try:
        state = torch.load(file, weights_only=False)
    except Exception as err:  # noqa: BLE001 - a damaged file is a user-facing error
        raise ValueError(f"--resume: cannot read {file}: {err}") from None
    version = state.get("format_version", 0)
    if version > STATE_FORMAT_VERSION:
        raise ValueError(f"--resume: {file} has training-state format version {version}, newer than the "
                         f"{STATE_FORMAT_VERSION} this spe reads: upgrade spe")
    return state

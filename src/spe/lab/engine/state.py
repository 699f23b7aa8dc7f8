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
global random states (torch CPU and CUDA, Python ``random``, NumPy), as tensors, lists and
numbers only: :func:`load_train_state` reads it with ``torch.load(..., weights_only=True)``,
so a state file cannot run code (a crafted pickle is refused, naming the file). A state of
another format version than :data:`STATE_FORMAT_VERSION` is refused, naming the file.

A run's checkpoint and its training state are one unit: :func:`load_unit` refuses a pair
whose steps differ.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from spe.checkpoint import MODEL_FILE, TRAIN_STATE_FILE, atomic_write, fsync_dir, load_metadata, save

__all__ = ["CHECKPOINTS_DIR", "STATE_FORMAT_VERSION", "Unit", "global_rng_states", "latest_checkpoint",
           "latest_unit", "link", "load_train_state", "load_unit", "repair_run_folder", "restore_global_rng",
           "save_checkpoint"]

CHECKPOINTS_DIR = "checkpoints"
# Version of train_state.pt's layout; states without one were written before it (version 0).
# 2: random states as tensors, lists and numbers only (readable with weights_only=True).
STATE_FORMAT_VERSION = 2
_STEP_DIR = re.compile(r"step-(\d+)$")


def global_rng_states() -> dict:
    """This process's global random states: torch CPU (dropout), CUDA, Python ``random``, NumPy.

    Tensors, tuples, lists and numbers only (no NumPy array), so the state pickles as data.
    """
    kind, key, pos, has_gauss, cached = np.random.get_state()
    states = {"torch": torch.get_rng_state(), "python": random.getstate(),
              "numpy": {"kind": str(kind), "key": [int(v) for v in key], "pos": int(pos),
                        "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_global_rng(states: dict) -> None:
    """Restores :func:`global_rng_states` output (CUDA states only where CUDA is in use)."""
    torch.set_rng_state(states["torch"])
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = states["numpy"]
    np.random.set_state((numpy_state["kind"], np.asarray(numpy_state["key"], dtype=np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
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


def checkpoint_folder(out: str | os.PathLike, step: int) -> Path:
    """``out/checkpoints/step-SSSSSSS``."""
    return Path(out) / CHECKPOINTS_DIR / f"step-{step:07d}"


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


@dataclass(frozen=True)
class Unit:
    """A checkpoint and its training state: the model file and the state file of one step."""

    model: Path
    state: Path


def latest_unit(out: str | os.PathLike, latest: str = "") -> Unit | None:
    """The newest complete checkpoint of a run as a :class:`Unit` (None if there is none).

    Args:
        out: the run folder.
        latest: the subfolder that holds the latest model ("" for the run folder itself;
            ``last`` for a Long Range Arena seed): runs written before ``checkpoints/``
            existed have their pair there (model) and in ``out`` (state).
    """
    out = Path(out)
    dirs = _step_dirs(out)
    if dirs:
        return Unit(dirs[0][1] / MODEL_FILE, dirs[0][1] / TRAIN_STATE_FILE)
    model, state = out / latest / MODEL_FILE, out / TRAIN_STATE_FILE
    return Unit(model, state) if model.is_file() and state.is_file() else None


def link(source: Path, target: Path) -> None:
    """Atomically makes ``target`` the same content as ``source`` (a hard link where possible)."""
    def write(tmp: str) -> None:
        os.unlink(tmp)
        try:
            os.link(source, tmp)
        except OSError:  # another file system, or links not supported
            shutil.copyfile(source, tmp)

    atomic_write(target, write)



def repair_run_folder(out: str | os.PathLike, latest: str = "") -> int | None:
    """Points ``out/LATEST/model.safetensors`` and ``out/train_state.pt`` at the newest complete checkpoint.

    After a crash between the two renames of :func:`save_checkpoint`, the run folder's pair
    can be from two steps (or the model missing); this restores a matching pair. Returns the
    step of the newest checkpoint (None if there is none).

    Args:
        out: the run folder.
        latest: as :func:`latest_unit`.
    """
    out = Path(out)
    dirs = _step_dirs(out)
    if not dirs:
        return None
    step, newest = dirs[0]
    model = out / latest / MODEL_FILE
    current = load_metadata(model).get("step") if model.is_file() else None
    if current != step or not (out / TRAIN_STATE_FILE).is_file() or \
            not os.path.samefile(out / TRAIN_STATE_FILE, newest / TRAIN_STATE_FILE):
        link(newest / TRAIN_STATE_FILE, out / TRAIN_STATE_FILE)
        link(newest / MODEL_FILE, model)
    return step


def save_checkpoint(out: Path, model, state: dict, *, step: int, metadata: dict, keep: int,
                    latest: str = "", before_links=None) -> Path:
    """Writes ``checkpoints/step-SSSSSSS/`` (state, then model), links the run folder to it, keeps ``keep``.

    The model file is written last: its presence marks the folder complete, so a kill at any
    moment leaves either this checkpoint or the previous one as the newest complete unit.

    Args:
        out: the run folder.
        model: the (unwrapped) model whose weights are saved in float32 as they are.
        state: the training state (see :func:`load_train_state`).
        step: the optimizer step (stamped into the state and, by the caller, the metadata).
        metadata: the model header's metadata.
        keep: how many checkpoint folders to keep (the newest).
        latest: the subfolder of the latest model link (see :func:`latest_unit`).
        before_links: called with the new folder once it is complete, before the run folder
            links and the pruning (e.g. to link the best model while its folder exists).

    Returns:
        The checkpoint folder.
    """
    folder = checkpoint_folder(out, step)
    folder.mkdir(parents=True, exist_ok=True)
    fsync_dir(folder.parent)
    stamped = {**state, "step": step, "format_version": STATE_FORMAT_VERSION}
    atomic_write(folder / TRAIN_STATE_FILE, lambda tmp: torch.save(stamped, tmp))
    save(model, folder, metadata=metadata)
    if before_links is not None:
        before_links(folder)
    link(folder / TRAIN_STATE_FILE, out / TRAIN_STATE_FILE)
    link(folder / MODEL_FILE, out / latest / MODEL_FILE)
    for _, old in _step_dirs(out)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def load_train_state(folder: Path, *, what: str = "--resume") -> dict:
    """Reads ``folder/train_state.pt`` (or the file ``folder``) with ``weights_only=True``: no code runs.

    Raises:
        ValueError: in one line naming the file, if it cannot be read, holds anything but
            tensors, numbers, strings and containers of them (e.g. a pickle that would
            call a function), or has another format version than this spe writes.
    """
    file = folder if folder.suffix == ".pt" else folder / TRAIN_STATE_FILE
    try:
        state = torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        found = re.search(r"(?:GLOBAL|global) ([\w.]+)", str(err))
        detail = f"it holds {found.group(1)}, which is not data" if found else "it holds something other than data"
        raise ValueError(f"{what}: refused {file}: {detail} (a training state holds only tensors and numbers; "
                         "nothing in it was run): delete it, or the run folder, to start again") from None
    except Exception as err:  # noqa: BLE001 - a damaged file is a user-facing error
        raise ValueError(f"{what}: cannot read {file}: {' '.join(str(err).split())}") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise ValueError(f"{what}: {file} is not a training state (no step)")
    version = state.get("format_version", 0)
    if version > STATE_FORMAT_VERSION:
        raise ValueError(f"{what}: {file} has training-state format version {version}, newer than the "
                         f"{STATE_FORMAT_VERSION} this spe reads: upgrade spe")
    if version < STATE_FORMAT_VERSION:
        raise ValueError(f"{what}: {file} has training-state format version {version}, older than the "
                         f"{STATE_FORMAT_VERSION} this spe reads: resume it with the spe that wrote it, or delete "
                         "the run folder to start again")
    return state


def load_unit(unit: Unit, *, what: str = "--resume") -> tuple[dict, dict]:
    """(metadata of the model, training state) of a checkpoint unit, after checking that their steps agree.

    Raises:
        ValueError: in one line if either file cannot be read, or the model's step differs
            from the state's (a pair from two saves: refused rather than resumed with the
            newer weights and the older optimizer and data stream).
    """
    metadata = load_metadata(unit.model)
    state = load_train_state(unit.state, what=what)
    if metadata.get("step") != state["step"]:
        raise ValueError(f"{what}: {unit.state} is at step {state['step']} but {unit.model} at step "
                         f"{metadata.get('step')}; they must be one checkpoint (the run was interrupted while "
                         "saving): delete the newer one to resume from the older")
    return metadata, state

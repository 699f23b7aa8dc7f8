"""A run folder belongs to one run: an advisory lock, spe's marker, and ``--overwrite`` that removes only spe's files.

* :func:`run_lock` holds ``OUT/.lock`` (``fcntl.flock``) for the life of a run, so a second
  ``spe`` process on the same folder is refused in one line naming the holder's PID. The
  kernel releases the lock when its process dies (a ``kill -9`` leaves no stale lock). The
  lock is re-entrant within a process (a plan runner holds a run's folder around the
  engine, which takes it again) and, under ``torchrun``, taken by rank 0 only, its answer
  broadcast so every process raises the same error.
* ``OUT/.spe-run`` marks a folder in which spe started a run (:func:`mark_run`): with a
  checkpoint of spe's (:func:`spe_run_found`), it is what makes files named ``metrics.jsonl``
  or ``loss.png`` spe's own. A folder without either is another tool's, and a run that would
  write over a file of it is refused (:func:`check_foreign_files`).
* :func:`clear_run` (``--overwrite``) removes the files spe writes and recognises: checkpoint
  units ``checkpoints/step-SSSSSSS/{model.safetensors, train_state.pt}``, the latest and
  best links, the training state, ``metrics.jsonl``, the task's plots, spe's TensorBoard
  event files (suffix ``.spe``) and atomic-write leftovers, then the folders it emptied.
  Anything else stays, and is named.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

from spe.checkpoint import MODEL_FILE, TRAIN_STATE_FILE, load_metadata
from spe.lab.engine.task import RunLayout
from spe.lab.engine.tensorboard import TENSORBOARD_SUFFIX

__all__ = ["LOCK_FILE", "MARKER_FILE", "TASKS", "RunFolderBusy", "check_foreign_files", "check_name", "check_task",
           "clear_run", "mark_run", "recorded_task", "run_lock", "spe_run_found"]

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
MARKER_FILE = ".spe-run"
TENSORBOARD_DIR = "tensorboard"
METRICS_FILE = "metrics.jsonl"
_STEP_DIR = re.compile(r"step-\d{7}$")
_TEMP_FILE = re.compile(r"^\..+\.[A-Za-z0-9_]+\.tmp$")  # spe.checkpoint.atomic_write's temporary names

# resolved folder -> [open lock file, depth]: the locks this process holds.
_HELD: dict[str, list] = {}


class RunFolderBusy(ValueError):
    """Another process holds the run folder's lock."""


def _holder(fh) -> str:
    fh.seek(0)
    text = fh.read().strip()
    return f"PID {text}" if text.isdigit() else "a process that has not written its PID yet"


def _acquire(folder: Path):
    """The open, locked ``folder/.lock``; raises :class:`RunFolderBusy` if another process holds it."""
    path = folder / LOCK_FILE
    while True:
        fh = open(path, "a+")  # noqa: SIM115 - held open for the life of the run
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                fh.close()
                raise
            holder = _holder(fh)
            fh.close()
            raise RunFolderBusy(f"{folder} is in use by another spe process ({holder}): wait for it to end, "
                                "or choose another --out") from None
        # The holder before us may have unlinked the file on release: then lock the new one.
        try:
            same = os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}\n")
            fh.flush()
            return fh
        fh.close()


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, innermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _release(folder: Path, fh, created: list[Path]) -> None:
    # Unlink while still holding the lock: a waiter that opened the old file sees it is gone and retries.
    with contextlib.suppress(FileNotFoundError):
        (folder / LOCK_FILE).unlink()
    fh.close()
    for made in created:  # innermost first, each only if the run left nothing in it
        try:
            made.rmdir()
        except OSError:
            break


@contextlib.contextmanager
def run_lock(folder: str | os.PathLike, ctx=None) -> Iterator[Path]:
    """Holds ``folder``'s advisory lock for the ``with`` block (creating the folder if needed).

    Args:
        folder: the run folder.
        ctx: the :class:`~spe.lab.engine.distributed.Distributed` context, or None for one process:
            rank 0 takes the lock and every process raises its refusal.

    Raises:
        RunFolderBusy: (a ValueError) if another process holds it, naming its PID.
    """
    folder = Path(folder)
    main = ctx is None or ctx.is_main
    key = str(folder.resolve())
    refusal = None
    created: list[Path] = []
    if main and key in _HELD:
        _HELD[key][1] += 1
    elif main:
        created = _missing_folders(folder)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            _HELD[key] = [_acquire(folder), 1]
        except RunFolderBusy as err:
            refusal = str(err)
    import torch.distributed as dist

    if ctx is not None and ctx.enabled and dist.is_available() and dist.is_initialized():
        shared = [refusal]
        dist.broadcast_object_list(shared, src=0)
        refusal = shared[0]
    if refusal is not None:
        raise RunFolderBusy(refusal)
    try:
        yield folder
    finally:
        if main:
            held = _HELD[key]
            held[1] -= 1
            if held[1] == 0:
                del _HELD[key]
                _release(folder, held[0], created)


def _is_spe_checkpoint(path: Path) -> bool:
    try:
        load_metadata(path)
    except (OSError, ValueError):
        return False
    return True


def spe_run_found(out: str | os.PathLike, latest: str = "") -> bool:
    """``out`` holds an spe run: spe's marker, or an spe checkpoint (latest or a checkpoint unit)."""
    out = Path(out)
    if (out / MARKER_FILE).is_file() or _is_spe_checkpoint(out / latest / MODEL_FILE):
        return True
    root = out / "checkpoints"
    return root.is_dir() and any(_STEP_DIR.match(d.name) and _is_spe_checkpoint(d / MODEL_FILE)
                                 for d in root.iterdir())


# The tasks the engine trains, each named by its command (``spe train`` …): a checkpoint records its
# task as ``task``; one written before that field is known by the key its task's options are under.
TASKS = ("train", "synth", "lra")


def recorded_task(metadata: dict) -> str | None:
    """The task that wrote a checkpoint (``train``, ``synth``, ``lra``), from its metadata; None if unknown."""
    task = metadata.get("task")
    if isinstance(task, str):
        return task
    return next((name for name in TASKS if isinstance(metadata.get(name), dict)), None)


def check_task(out: str | os.PathLike, latest: str, task: str) -> None:
    """Refuses a run folder whose checkpoint another task wrote (an ``spe synth`` seed folder given
    to ``spe train --resume`` loaded weights of another shape, a ``state_dict`` traceback).

    Args:
        out: the run (or experiment) folder.
        latest: the subfolder of its latest model (as :class:`~spe.lab.engine.task.RunLayout`).
        task: the task about to use it.

    Raises:
        ValueError: ``OUT holds a run of spe OTHER (FILE), not of spe TASK: choose another --out``.
            A folder without a readable spe checkpoint, or one whose task is unknown, passes.
    """
    model = Path(out) / latest / MODEL_FILE
    if not model.is_file():
        return
    try:
        found = recorded_task(load_metadata(model))
    except (OSError, ValueError):  # not spe's: check_foreign_files and the loaders say so
        return
    if found is not None and found != task:
        raise ValueError(f"{out} holds a run of spe {found} ({model}), not of spe {task}: choose another --out "
                         "(nothing was changed)")


def mark_run(out: str | os.PathLike, command: str) -> None:
    """Writes spe's marker in ``out`` (once): the folder now holds a run of ``command``."""
    path = Path(out) / MARKER_FILE
    if not path.exists():
        path.write_text(json.dumps({"spe_run": command}) + "\n")


def _run_files(layout: RunLayout) -> list[str]:
    """The names a run writes directly (folders of units and event files aside)."""
    return [str(Path(layout.latest) / MODEL_FILE), TRAIN_STATE_FILE, METRICS_FILE, *layout.extra_files,
            *([str(Path(layout.best) / MODEL_FILE)] if layout.best else [])]


def check_foreign_files(out: str | os.PathLike, layout: RunLayout) -> None:
    """Refuses a folder that holds no spe run but files a run would write over.

    Raises:
        ValueError: naming the folder and the files.
    """
    out = Path(out)
    if not out.is_dir() or spe_run_found(out, layout.latest):
        return
    taken = [name for name in _run_files(layout) if (out / name).exists()]
    if taken:
        raise ValueError(f"{out} holds no spe run but files a run would write over ({', '.join(taken)}): "
                         "choose another --out (nothing was changed)")


def _remove(path: Path, removed: list[Path]) -> None:
    if path.is_file() or path.is_symlink():
        path.unlink()
        removed.append(path)


def _remove_unit_dir(folder: Path, removed: list[Path]) -> None:
    """A checkpoint unit's files and atomic-write leftovers; the folder itself if that emptied it."""
    for name in (MODEL_FILE, TRAIN_STATE_FILE):
        _remove(folder / name, removed)
    for path in folder.iterdir():
        if _TEMP_FILE.match(path.name):
            _remove(path, removed)
    with contextlib.suppress(OSError):
        folder.rmdir()


def clear_run(out: str | os.PathLike, layout: RunLayout) -> list[Path]:
    """Removes the previous spe run in ``out`` (``--overwrite``): spe's files only, then the folders it emptied.

    A folder where no spe run is found is not touched. Returns the files removed; files left
    beside them (another tool's) are logged.
    """
    out = Path(out)
    if not spe_run_found(out, layout.latest):
        log.info("--overwrite: %s holds no spe run; nothing removed", out)
        return []
    removed: list[Path] = []
    for name in _run_files(layout):
        _remove(out / name, removed)
    for sub in (layout.latest, layout.best or "", "checkpoints", TENSORBOARD_DIR):
        folder = out / sub
        if not sub or not folder.is_dir():
            continue
        for path in folder.iterdir():
            if sub == "checkpoints" and path.is_dir() and _STEP_DIR.match(path.name):
                _remove_unit_dir(path, removed)
            elif sub == TENSORBOARD_DIR and path.name.startswith("events.out.tfevents.") \
                    and path.name.endswith(TENSORBOARD_SUFFIX):
                _remove(path, removed)
            elif _TEMP_FILE.match(path.name):
                _remove(path, removed)
        with contextlib.suppress(OSError):
            folder.rmdir()
    for path in out.iterdir():
        if _TEMP_FILE.match(path.name):
            _remove(path, removed)
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                  if p.is_file() and p.name not in (LOCK_FILE, MARKER_FILE))
    log.info("--overwrite: removed the previous run in %s (%d files)%s", out, len(removed),
             f"; left {len(left)} file(s) spe did not write: {', '.join(left[:5])}"
             f"{' …' if len(left) > 5 else ''}" if left else "")
    return removed


# What sweeps and studies write next to their rows' folders in --out (a row of that name
# would be trained first, then fail at the first write of the results).
RESERVED_NAMES = ("results.json", "results.md", "loss.png")
# NAME_MAX of Linux and macOS file systems, in bytes
MAX_NAME_BYTES = 255


def check_name(name: object, where: str) -> str:
    """A plan's variant or row name, which becomes a folder of ``--out``: a plain, printable name.

    Raises:
        ValueError: naming ``where`` (the plan file and the row), for an empty name, a path
            separator, ``..``, a leading dot, an unprintable character, the name of a file the
            sweep writes (:data:`RESERVED_NAMES`) or more than :data:`MAX_NAME_BYTES` bytes.
    """
    problem = None
    if not isinstance(name, str) or not name:
        problem = "is empty"
    elif "/" in name or "\\" in name or (os.altsep and os.altsep in name):
        problem = "holds a path separator"
    elif ".." in name:
        problem = "holds '..'"
    elif name.startswith("."):
        problem = "starts with a dot"
    elif not name.isprintable() or name != name.strip():
        problem = "holds an unprintable character or surrounding space"
    elif name.lower() in RESERVED_NAMES:
        problem = f"is a file the sweep writes in --out ({', '.join(RESERVED_NAMES)})"
    elif len(name.encode()) > MAX_NAME_BYTES:
        problem = f"is {len(name.encode())} bytes long, more than the {MAX_NAME_BYTES} a folder name may have"
    if problem:
        raise ValueError(f"{where}: the name {name!r} {problem}; it names a folder under --out: give a plain name "
                         "such as 'sinespe-k5'")
    return name

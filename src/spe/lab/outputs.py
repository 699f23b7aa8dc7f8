"""Outputs never replace inputs: the checks every command runs on its output paths before any work.

A command's ``--json``/``--out`` file must not be a file the command reads (a checkpoint, a
prompt), an spe checkpoint or training state of any run, or a folder; and it must be
writable, which is checked before hours of measuring rather than at the final write.
An output folder must not be a file. No output may lie in (or be) the data folder a command
reads: it would replace a piece or add files among them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from spe.checkpoint import MODEL_FILE, TRAIN_STATE_FILE

__all__ = ["check_output_file", "check_output_folder", "check_outside_data", "default_cache_dir", "display_name",
           "shown_names"]

_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format: a training state or another torch file


def _read_files(reads: Iterable[str | os.PathLike | None]) -> list[Path]:
    """The files behind ``reads``: a run folder stands for its checkpoint."""
    files = []
    for item in reads:
        if item is None or isinstance(item, (dict, list)):
            continue
        path = Path(item)
        files.append(path / MODEL_FILE if path.is_dir() else path)
    return [f for f in files if f.exists()]


def _kind(path: Path) -> str | None:
    """'an spe checkpoint', 'a training state (torch file)' or None, from the file's first bytes."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return None
    if head.startswith(_ZIP_MAGIC) or path.name == TRAIN_STATE_FILE:
        return "a training state (a torch file)"
    # safetensors: an 8-byte little-endian header length, then the JSON header
    if path.name == MODEL_FILE or (len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 27):
        return "a checkpoint (safetensors)"
    return None


def _writable_parent(path: Path, flag: str, shown: Path | None = None) -> None:
    """Refuses ``path`` (named ``shown`` in messages) if its first existing folder is a file or read-only."""
    parent, shown = path.parent, shown or path
    while not parent.exists():  # the command creates missing folders: the first existing one decides
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {shown}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {shown}: cannot write in {parent} (permission denied)")


def check_output_file(path: str | os.PathLike, flag: str, *, reads: Iterable = ()) -> Path:
    """Refuses an output file that would replace an input, a checkpoint or a training state.

    Args:
        path: the output file the command will write.
        flag: the option naming it in messages (e.g. ``--json``).
        reads: files (or run folders) the command reads.

    Returns:
        ``path`` as a Path.

    Raises:
        ValueError: naming the flag and the path, if it is a folder, a file the command
            reads, a checkpoint or training state, or cannot be written.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder: give a file name")
    if path.exists():
        for source in _read_files(reads):
            if os.path.samefile(path, source):
                same = "" if path.resolve() == source.resolve() else f" (the same file as {source})"
                raise ValueError(f"{flag} {path} is a file this command reads{same}: choose another file "
                                 "(nothing was written)")
        kind = _kind(path)
        if kind:
            raise ValueError(f"{flag} {path} is {kind}: choose another file (nothing was written)")
        if not os.access(path, os.W_OK):
            raise ValueError(f"{flag} {path}: cannot write it (permission denied)")
    else:
        _writable_parent(path, flag)
    return path


def check_output_folder(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Refuses an output folder that is a file (a checkpoint, a prompt …) or cannot be created.

    Raises:
        ValueError: naming the flag and the path.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        kind = _kind(path)
        raise ValueError(f"{flag} {path} is {kind or 'a file'}, not a folder: give a folder (nothing was written)")
    if not path.exists():
        _writable_parent(path / "x", flag, shown=path)
    return path


def check_outside_data(path: str | os.PathLike, flag: str, data: str | os.PathLike | None) -> None:
    """Refuses an output (file or folder) that is the data folder ``data`` or lies inside it.

    Args:
        path: the output path.
        flag: the option naming it in messages (``--out``, ``--json``).
        data: the data the command reads: a local folder, or anything else (None,
            ``music21:NAME``), which holds no output.

    Raises:
        ValueError: naming the flag, the path and the folder.
    """
    if data is None or not isinstance(data, (str, os.PathLike)) or not Path(data).is_dir():
        return
    folder, target = Path(data).resolve(), Path(path).resolve()
    if target == folder or folder in target.parents:
        raise ValueError(f"{flag} {path} is {'' if target == folder else 'inside '}the data folder {data} this "
                         "command reads: choose a path outside it (nothing was written)")


def default_cache_dir() -> Path:
    """``$SPE_CACHE_DIR``, or ``~/.cache/spe``."""
    return Path(os.environ.get("SPE_CACHE_DIR", Path.home() / ".cache" / "spe"))


def display_name(path: str | bytes | os.PathLike) -> str:
    """A file name as text, its undecodable bytes escaped: ``b"bad\xff.mid"`` -> ``bad\\xff.mid``.

    A name that is not valid UTF-8 reaches Python with surrogates (``bad\udcff.mid``), which
    cannot be encoded, written to JSON text files or hashed as UTF-8; this form can.
    """
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def shown_names(paths: list[Path], limit: int = 5) -> str:
    """The first ``limit`` names (:func:`display_name`), then how many more."""
    shown = ", ".join(display_name(p) for p in paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")

"""What a run trains on, recorded in its checkpoints and compared when it resumes: every task's
(the music pieces, the LRA examples) data record and the one refusal of changed data."""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections.abc import Sequence
from dataclasses import fields

import numpy as np

__all__ = ["check_data", "data_record"]

log = logging.getLogger(__name__)


def data_record(**splits: Sequence) -> dict:
    """What a run trains and validates on, for its checkpoints: ``{split: {"count": n, "digest": hex}}``.

    The digest covers every array of the split in order (dtype, shape and values), so that the
    same files give the same record, and a piece added, removed, edited or moved to the other
    split changes it. Hashing costs about a second per GB.

    Args:
        splits: split name -> its ``n`` examples: a list of arrays (numpy, or CPU tensors; a
            music piece each), or a dataclass of such arrays with a length (an LRA dataset).
    """
    record = {}
    for name, split in splits.items():
        arrays = split if isinstance(split, list | tuple) else \
            [value for f in fields(split) if hasattr(value := getattr(split, f.name), "__array__")]
        digest = hashlib.blake2b(digest_size=16)
        for array in arrays:
            array = np.ascontiguousarray(np.asarray(array))
            digest.update(f"{array.dtype.str}{array.shape};".encode())
            digest.update(array.data)
        record[name] = {"count": len(split), "digest": digest.hexdigest()}
    return record


def _data_changes(stored: dict, current: dict, unit: str) -> list[str]:
    """``train pieces 86 -> 188``, ``validation pieces: other pieces (5)``, for each split that differs
    (a stored split without a count or digest, from an older spe, is compared on what it has)."""
    changes = []
    for name, now in current.items():
        before = stored.get(name)
        before = before if isinstance(before, dict) else {}
        if before.get("count", now["count"]) != now["count"]:
            changes.append(f"{name} {unit} {before['count']} -> {now['count']}")
        elif before.get("digest", now["digest"]) != now["digest"]:
            changes.append(f"{name} {unit}: the same number ({now['count']}), other contents")
    return changes


def check_data(stored: dict | None, current: dict, *, where: str, unit: str, allow_change: bool,
               hint: str) -> None:
    """Refuses to resume a run on data other than it started on (or, when allowed, warns and continues).

    Args:
        stored: the checkpoint's :func:`data_record` (None: written before records existed; a
            record without digests is compared on its counts).
        current: the record of the data loaded now.
        where: ``the data in DIR`` / ``the data of RUN``, for messages.
        unit: what the splits count (``pieces``, ``examples``).
        allow_change: continue on changed data with a warning instead of refusing.
        hint: what the user can do, ending the refusal.

    Raises:
        ValueError: ``--resume: WHERE changed since the run started (CHANGES): HINT``.
    """
    if stored is None:
        log.info("--resume: the checkpoint records no data digest (written by an older spe): the data "
                 "is not compared")
        return
    changes = _data_changes(stored if isinstance(stored, dict) else {}, current, unit)
    if not changes:
        return
    message = f"--resume: {where} changed since the run started ({', '.join(changes)})"
    if not allow_change:
        raise ValueError(f"{message}: {hint}")
    warnings.warn(f"{message}; continuing on the new data as allow_data_change asks: the run's "
                  "validation losses before and after this step are not comparable", stacklevel=2)

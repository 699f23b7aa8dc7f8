"""``metrics.jsonl``: one JSON record per line, appended during training, trimmed on resume.

A kill while appending can leave the last line half-written. Reading drops such a torn
last line with a warning that names the file; a damaged line anywhere else is an error
that names the file and the line. Rewrites (trimming to the step a resumed checkpoint has
seen) go through :func:`spe.checkpoint.atomic_write`, so a kill during one leaves the old
file or the new one.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from spe.lab import strict_json
from spe.checkpoint import atomic_write

__all__ = ["append_record", "read_records", "trim_records"]


def _parse(line: str) -> dict | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return record if isinstance(step, int) and not isinstance(step, bool) else None


def _read(path: Path) -> list[tuple[str, dict]]:
    """(line, record) of every record of ``path``; see :func:`read_records`."""
    lines = path.read_text(errors="replace").splitlines()
    found = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = _parse(line)
        if record is None and number == len(lines):
            warnings.warn(f"{path}: dropped its last line, half-written when a previous run was stopped "
                          f"({line[:40]!r})", stacklevel=3)
            continue
        if record is None:
            raise ValueError(f"{path}: line {number} is not a metrics record with a step ({line[:40]!r}); "
                             "delete the run folder to start again")
        found.append((line, record))
    return found


def read_records(path: str | Path) -> list[dict]:
    """The records of a metrics file (``[]`` if it does not exist).

    Raises:
        ValueError: naming the file and line if a line other than the last is not a JSON
            record with an integer ``step``; a torn last line is dropped with a warning.
    """
    path = Path(path)
    return [record for _, record in _read(path)] if path.exists() else []


def trim_records(path: str | Path, step: int) -> list[dict]:
    """Keeps the records of steps ≤ ``step`` (what the checkpoint resumed from has seen); returns them.

    Kept lines are left as they were; the file is rewritten atomically, and only if
    something is dropped.

    Raises:
        ValueError: as :func:`read_records`.
    """
    path = Path(path)
    if not path.exists():
        return []
    kept = [(line, record) for line, record in _read(path) if record["step"] <= step]
    text = "".join(line + "\n" for line, _ in kept)
    if text != path.read_text(errors="replace"):
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))
    return [record for _, record in kept]


def append_record(path: str | Path, record: dict) -> None:
    """Appends one record (non-finite floats as null) as a line."""
    with open(path, "a") as fh:
        fh.write(strict_json.dumps(record) + "\n")

"""User options decoded in one place, shared by the library and the ``spe`` command.

Config files and command-line flags have no null, so some options spell "none" as 0; each
such convention is decoded here once (issue 18: "window 0 means None" was decoded three
times). No torch import: the CLI checks its flags before loading anything heavy.
"""

from __future__ import annotations

__all__ = ["check_threads", "decode_window"]


def decode_window(value: int | None, name: str = "window") -> int | None:
    """A sliding attention window option W in positions: 0 means the whole past (None).

    Args:
        value: None (keep what the model has), 0 (the whole past) or W > 0 positions.
        name: how the caller names the option in messages (``--window``, ``attention_window``).

    Returns:
        None for 0 (and for None), else W.

    Raises:
        ValueError: naming ``name`` and the value, unless it is None or an int ≥ 0 (bools refused).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be 0 (the whole past) or a positive number of positions, got {value!r}")
    return value or None


def check_threads(value: int | None, name: str = "threads") -> None:
    """Validates a CPU thread count: None or 0 (PyTorch's default) or a positive count.

    Raises:
        ValueError: naming ``name`` and the value (``torch.set_num_threads(-1)`` raises a
            RuntimeError deep inside a run otherwise).
    """
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be 0 (PyTorch's default) or a positive number of CPU threads, "
                         f"got {value!r}")

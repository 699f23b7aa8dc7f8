"""Checks every kernel family shares: a window's length, one decoding position."""

from __future__ import annotations

from torch import Tensor

__all__ = ["check_one_position", "check_window"]


def check_window(window: int | None, name: str = "window") -> None:
    """Validates a sliding-window length W (positions).

    Raises:
        ValueError: naming ``name``, unless W is None or a positive int (bools refused).
    """
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"{name} must be a positive number of positions or None, got {window!r}")


def check_one_position(**tensors: Tensor) -> None:
    for name, t in tensors.items():
        if t.dim() != 4 or t.shape[1] != 1:
            raise ValueError(f"a decoding step takes one position, {name} of shape (B, 1, H, ·), got {tuple(t.shape)}")

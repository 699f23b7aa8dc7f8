"""What every kernel family shares: the checks of a window's length and of one decoding position,
and the references' masks."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_one_position", "check_window", "reference_keep"]


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


def reference_keep(queries: int, keys: int, device, *, causal: bool, window: int | None,
                   key_padding_mask: Tensor | None) -> Tensor:
    """The float64 references' causal, window and padding masks over (query m, key n), lag m − n:
    (B or 1, 1, Lq, Lk) bool, True where a key is kept."""
    lag = torch.arange(queries, device=device)[:, None] - torch.arange(keys, device=device)[None, :]
    keep = torch.ones(queries, keys, dtype=torch.bool, device=device)
    if causal:
        keep &= lag >= 0
    if window is not None:
        keep &= lag < window
    keep = keep[None, None]
    if key_padding_mask is not None:
        keep = keep & ~key_padding_mask[:, None, None, :]
    return keep

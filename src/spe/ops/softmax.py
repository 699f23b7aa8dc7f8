"""Exact softmax attention, the reference and baseline. Letters: B, L, H, E as elsewhere."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["softmax_attention"]


def check_window(window: int | None, name: str = "window") -> None:
    """Validates a sliding-window length W (positions).

    Raises:
        ValueError: naming ``name``, unless W is None or a positive int (bools refused).
    """
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"{name} must be a positive number of positions or None, got {window!r}")


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, window: int | None = None) -> Tensor:
    """softmax(q kᵀ / √E) v, with PyTorch's fused kernel.

    Args:
        q: (B, Lq, H, E).
        k: (B, Lk, H, E).
        v: (B, Lk, H, Ev).
        causal: mask keys after each query (Lq = Lk).
        window: W, causal sliding window: query m sees keys n ∈ (m − W, m] only (then a
            boolean L × L mask replaces the fused causal path). None: no window.

    Returns:
        (B, Lq, H, Ev), in ``v``'s dtype.

    Raises:
        ValueError: on a window without ``causal`` or a non-positive window.

    Precision: autocast is switched off here; on the CPU the scores and their sums are formed
    in at least float32 (inputs promoted), on CUDA half-precision inputs go to the fused
    kernels, which accumulate in float32 themselves.
    """
    mask = None
    if window is not None:
        if not causal:
            raise ValueError("a sliding window needs causal attention")
        check_window(window)
        if window < q.shape[1]:
            i = torch.arange(q.shape[1], device=q.device)
            lag = i[:, None] - i[None, :]
            mask = (lag >= 0) & (lag < window)
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    if q.device.type != "cuda":
        dtype = torch.promote_types(dtype, torch.float32)
    with torch.autocast(device_type=q.device.type, enabled=False):
        out = F.scaled_dot_product_attention(q.to(dtype).transpose(1, 2), k.to(dtype).transpose(1, 2),
                                             v.to(dtype).transpose(1, 2), attn_mask=mask,
                                             is_causal=causal and mask is None)
    return out.transpose(1, 2).to(v.dtype)

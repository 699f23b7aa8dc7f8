"""Exact softmax attention, the reference and baseline. Letters: B, L, H, E as elsewhere."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["check_key_padding_mask", "softmax_attention"]


def check_window(window: int | None, name: str = "window") -> None:
    """Validates a sliding-window length W (positions).

    Raises:
        ValueError: naming ``name``, unless W is None or a positive int (bools refused).
    """
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"{name} must be a positive number of positions or None, got {window!r}")


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, window: int | None = None,
                      key_padding_mask: Tensor | None = None) -> Tensor:
    """softmax(q kᵀ / √E) v, with PyTorch's fused kernel.

    Args:
        q: (B, Lq, H, E).
        k: (B, Lk, H, E).
        v: (B, Lk, H, Ev).
        causal: mask keys after each query (Lq = Lk).
        window: W, causal sliding window: query m sees keys n ∈ (m − W, m] only (then a
            boolean L × L mask replaces the fused causal path). None: no window.
        key_padding_mask: (B, Lk) bool, True at padding keys (PyTorch's convention), which
            get no weight; non-causal only; every query needs one real key.

    Returns:
        (B, Lq, H, Ev), in ``v``'s dtype.

    Raises:
        ValueError: on a window without ``causal`` or a non-positive window, or a padding
            mask with ``causal`` or of the wrong shape.

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
    if key_padding_mask is not None:
        mask = _padding_mask(key_padding_mask, k, causal)
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    if q.device.type != "cuda":
        dtype = torch.promote_types(dtype, torch.float32)
    with torch.autocast(device_type=q.device.type, enabled=False):
        out = F.scaled_dot_product_attention(q.to(dtype).transpose(1, 2), k.to(dtype).transpose(1, 2),
                                             v.to(dtype).transpose(1, 2), attn_mask=mask,
                                             is_causal=causal and mask is None)
    return out.transpose(1, 2).to(v.dtype)


def _padding_mask(key_padding_mask: Tensor, k: Tensor, causal: bool) -> Tensor:
    """(B, 1, 1, Lk) bool, True where attention is allowed (scaled_dot_product_attention's convention)."""
    if causal:
        raise ValueError("key_padding_mask is for non-causal attention (a causal model has no padding before "
                         "its last real token)")
    return check_key_padding_mask(key_padding_mask, k)


def check_key_padding_mask(key_padding_mask: Tensor, k: Tensor) -> Tensor:
    """Validates a key padding mask for keys ``k`` (B, Lk, H, E), as every softmax path with a
    score term does (:mod:`spe.attention.kernels`).

    Args:
        key_padding_mask: (B, Lk) bool, True at padding keys.
        k: the keys it masks.

    Returns:
        (B, 1, 1, Lk) bool, True where attention is allowed.

    Raises:
        ValueError: naming the shape and dtype received, unless the mask is (B, Lk) bool.
    """
    if key_padding_mask.shape != k.shape[:2] or key_padding_mask.dtype != torch.bool:
        raise ValueError(f"key_padding_mask must be a (batch, keys) = {tuple(k.shape[:2])} bool tensor, got "
                         f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}")
    return ~key_padding_mask[:, None, None, :]

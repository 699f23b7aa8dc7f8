"""Exact softmax attention, the baseline, with FoX's forget gate (Lin et al. 2025): PyTorch's fused
kernel; FoX's bias as one (B, H, L, L) tensor below :data:`FLASH_FOX_MIN_LENGTH` positions, from it
on the O(L)-memory form of :mod:`spe.ops.softmax.flash`.
Letters: B, L, H, E as elsewhere."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from spe.ops.common.checks import check_window
from spe.ops.decay.sums import segment_sums, suffix_sums
from spe.ops.softmax.checks import check_key_padding_mask, softmax_gates
from spe.ops.softmax.flash import flash_fox_attention

__all__ = ["FLASH_FOX_MIN_LENGTH", "FOX_QUERY_BLOCK", "attend", "check_key_padding_mask", "gate_bias",
           "softmax_attention", "softmax_gates"]

# Queries per block of FoX's bias beyond this length: the (B, H, L, L) bias of a long sequence
# (and its gradient, and its segment sums) would be 66 GB at B = 2, H = 8, L = 16,384 (measured on
# an H200); block by block, recomputed in backward, it is (B, H, FOX_QUERY_BLOCK, L) at a time.
FOX_QUERY_BLOCK = 1024

# From this many positions on, FoX takes the flash-style form (spe.ops.softmax.flash: the gate as
# one more coordinate of q and k, PyTorch's fused kernel per block of queries, O(L) memory); below
# it the one-bias form, whose single kernel call is as fast or faster there. Rough runs on a loaded
# 2-core CPU (forward + backward, D = 64, one thread): at 256 the flash form as fast or faster in
# every run (B = 1, H = 4: 1.0-1.4x; B = 8, H = 8: 1.6-1.8x); at 128 it depends on the batch (B = 8:
# 1.1-1.35x faster; B = 1: up to 1.8x slower); at 1,024 3.7x and at 2,048 4x faster (B = 1).
FLASH_FOX_MIN_LENGTH = 256


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, window: int | None = None,
                      key_padding_mask: Tensor | None = None, log_decay: Tensor | None = None) -> Tensor:
    """softmax(q kᵀ / √E) v, with PyTorch's fused kernel; with a gate, FoX.

    Args:
        q: (B, Lq, H, E).
        k: (B, Lk, H, E).
        v: (B, Lk, H, Ev).
        causal: mask keys after each query (Lq = Lk).
        window: W, causal sliding window: query m sees keys n ∈ (m − W, m] only (then a
            boolean L × L mask replaces the fused causal path). None: no window.
        key_padding_mask: (B, Lk) bool, True at padding keys (PyTorch's convention), which
            get no weight; non-causal only; every query needs one real key.
        log_decay: FoX's forget gate, (B, L, H) log gates G_t ≤ 0 (or (H,), a constant one):
            the logits gain Σ_{n<t≤m} G_t (below :data:`FLASH_FOX_MIN_LENGTH` positions a
            (B, H, L, L) bias, :func:`gate_bias`, formed from each segment's own terms; from
            it on :func:`~spe.ops.softmax.flash.flash_fox_attention`, which forms nothing of
            size L × L); causal only, Lq = Lk. None: none.

    Returns:
        (B, Lq, H, Ev), in ``v``'s dtype.

    Raises:
        ValueError: on a window without ``causal`` or a non-positive window, a padding mask
            with ``causal`` or of the wrong shape, or a bad gate (shape, values, without
            ``causal``, Lq ≠ Lk).

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
    if log_decay is not None:
        if not causal or k.shape[1] != q.shape[1]:
            raise ValueError(f"a forget gate (log_decay) needs causal attention with as many queries as keys, got "
                             f"causal={causal}, {q.shape[1]} queries and {k.shape[1]} keys")
        return _gated_attention(q, k, v, softmax_gates(log_decay, q.shape), window)
    return attend(q, k, v, mask, causal=causal and mask is None)


def _gated_attention(q: Tensor, k: Tensor, v: Tensor, gates: Tensor, window: int | None) -> Tensor:
    """FoX: one bias for short sequences, the flash-style form from :data:`FLASH_FOX_MIN_LENGTH` on
    (below it, when set above :data:`FOX_QUERY_BLOCK`: blocks of that many queries, each reading
    the keys its queries reach, its bias recomputed in backward)."""
    n = q.shape[1]
    if n >= FLASH_FOX_MIN_LENGTH:
        return flash_fox_attention(q, k, v, gates, window=window)
    if n <= FOX_QUERY_BLOCK:
        return attend(q, k, v, gate_bias(gates, window))
    outs = []
    for s in range(0, n, FOX_QUERY_BLOCK):
        e = min(n, s + FOX_QUERY_BLOCK)
        lo = 0 if window is None else max(0, s - window + 1)
        part = (q[:, s:e], k[:, lo:e], v[:, lo:e], gates[:, lo:e])
        if torch.is_grad_enabled() and any(t.requires_grad for t in part):
            outs.append(checkpoint(_gated_block, *part, s - lo, window, use_reentrant=False))
        else:
            outs.append(_gated_block(*part, s - lo, window))
    return torch.cat(outs, dim=1)


def _gated_block(q: Tensor, k: Tensor, v: Tensor, gates: Tensor, start: int, window: int | None) -> Tensor:
    return attend(q, k, v, gate_bias(gates, window, start))


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, causal: bool = False) -> Tensor:
    """softmax(q kᵀ / √D + mask) v by PyTorch's fused kernel, autocast off, in at least float32
    on the CPU: q (B, Lq, H, D), k (B, Lk, H, D), v (B, Lk, H, E); mask None, bool (True:
    attend) or a float bias, broadcastable to (B, H, Lq, Lk), whose dtype the scores take at
    least (CUDA too). Returns (B, Lq, H, E) in ``v``'s dtype."""
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    if q.device.type != "cuda":
        dtype = torch.promote_types(dtype, torch.float32)
    if mask is not None and mask.is_floating_point():
        # a FoX bias of sums of gates (hundreds of nats) keeps its float32 precision: the scores follow it
        dtype = torch.promote_types(dtype, mask.dtype)
        mask = mask.to(dtype)
    with torch.autocast(device_type=q.device.type, enabled=False):
        out = F.scaled_dot_product_attention(q.to(dtype).transpose(1, 2), k.to(dtype).transpose(1, 2),
                                             v.to(dtype).transpose(1, 2), attn_mask=mask, is_causal=causal)
    return out.transpose(1, 2).to(v.dtype)


def _padding_mask(key_padding_mask: Tensor, k: Tensor, causal: bool) -> Tensor:
    """(B, 1, 1, Lk) bool, True where attention is allowed (scaled_dot_product_attention's convention)."""
    if causal:
        raise ValueError("key_padding_mask is for non-causal attention (a causal model has no padding before "
                         "its last real token)")
    return check_key_padding_mask(key_padding_mask, k)


def gate_bias(gates: Tensor, window: int | None = None, start: int = 0) -> Tensor:
    """FoX's logit term Σ_{n<t≤m} G_t for n ≤ m (and m − n < W), −∞ elsewhere, for the queries
    m = start … L − 1 and every key: (B, H, L − start, L) from gates (B, L, H).

    Each entry is a sum of its own terms (no difference of running sums): inside the rows'
    block the segment sums; for a key n before it, Σ_{start≤t≤m} G_t + Σ_{n<t<start} G_t,
    two sums of terms ≤ 0. Memory: the block's (L − start)² segment sums and the bias.
    """
    n = gates.shape[1]
    bias = segment_sums(gates[:, start:], 1)  # (B, Lq, Lq, H), keys start … L − 1
    if start:
        within = torch.cumsum(gates[:, start:], 1)  # (B, Lq, H)
        before = suffix_sums(gates[:, :start], 1)  # (B, start, H): Σ_{n<t<start}
        bias = torch.cat([within[:, :, None] + before[:, None], bias], dim=2)
    lag = torch.arange(start, n, device=gates.device)[:, None] - torch.arange(n, device=gates.device)[None, :]
    keep = (lag >= 0) if window is None else (lag >= 0) & (lag < window)
    return bias.permute(0, 3, 1, 2).masked_fill(~keep, -math.inf)

"""The float64 reference of softmax attention: the explicit O(L²) scores, masks and FoX bias.

Letters: B = batch, L = length, H = num_heads, D = query/key dimension, E = value dimension.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spe.ops.common.checks import reference_keep

__all__ = ["block_local_reference", "gated_softmax_reference", "softmax_attention_reference"]


def softmax_attention_reference(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, window: int | None = None,
                                key_padding_mask: Tensor | None = None,
                                log_decay: Tensor | None = None) -> Tensor:
    """softmax_n(q_m·k_n/√D + F_m − F_n) v_n in float64, explicitly, over the keys kept: n ≤ m when
    causal, m − n < W with a window, n not padding; F_t = Σ_{s≤t} G_s the running sum of FoX's
    gate (a difference of float64 running sums: exact enough for tests), none without one.
    For tests of :func:`~spe.ops.softmax.chunk.softmax_attention`; memory O(B·H·L²).

    Args:
        q: (B, Lq, H, D); k: (B, Lk, H, D); v: (B, Lk, H, E).
        causal, window, key_padding_mask: as :func:`~spe.ops.softmax.chunk.softmax_attention`.
        log_decay: (B, L, H) log gates, or (H,) a constant one; None: none.

    Returns:
        (B, Lq, H, E) in float64.
    """
    f64 = torch.float64
    q, k, v = q.to(f64), k.to(f64), v.to(f64)
    b, lq, h, d = q.shape
    logits = torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(d)
    keep = reference_keep(lq, k.shape[1], q.device, causal=causal, window=window, key_padding_mask=key_padding_mask)
    if log_decay is not None:  # (H,) broadcasts over batch and positions as a constant gate
        f = torch.cumsum(log_decay.to(f64).expand(b, lq, h), dim=1).permute(0, 2, 1)  # (B, H, L)
        logits = logits + f[..., :, None] - f[..., None, :]
    weights = torch.softmax(logits.masked_fill(~keep, -math.inf), dim=-1)
    return torch.einsum("bhmn,bnhe->bmhe", weights, v)


def gated_softmax_reference(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, *,
                            window: int | None = None) -> Tensor:
    """FoX in float64, explicitly: softmax_n(q_m·k_n/√D + F_m − F_n) v_n over n ≤ m (m − n < W),
    F_t = Σ_{s≤t} G_s (a difference of float64 running sums: exact enough for tests).

    Args:
        q, k: (B, L, H, D); v: (B, L, H, E); log_decay: (B, L, H) or (H,) (constant).

    Returns:
        (B, L, H, E) in float64.
    """
    f64 = torch.float64
    q, k, v, g = q.to(f64), k.to(f64), v.to(f64), log_decay.to(f64)
    b, n, h, _ = q.shape
    f = torch.cumsum(g.expand(b, n, h), dim=1).permute(0, 2, 1)  # (B, H, L)
    logits = torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(q.shape[-1]) + f[..., :, None] - f[..., None, :]
    i = torch.arange(n)
    lag = i[:, None] - i[None, :]
    keep = (lag >= 0) if window is None else (lag >= 0) & (lag < window)
    weights = torch.softmax(logits.masked_fill(~keep, -math.inf), dim=-1)
    return torch.einsum("bhmn,bnhe->bmhe", weights, v)


def block_local_reference(q: Tensor, k: Tensor, v: Tensor, block: int, *, causal: bool,
                          key_padding_mask: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """Block-local softmax attention (:func:`~spe.ops.softmax.local.block_local_attention`) in
    float64 as the L × L masked form: softmax_n(q_m·k_n/√D + s_mn) v_n over the keys n with
    ⌊m/N⌋ − ⌊n/N⌋ ∈ {0, 1}, n ≤ m when causal, n not padding. For tests; memory O(B·H·L²).

    Args:
        q: (B, L, H, D); k: (B, L, H, D); v: (B, L, H, E).
        block: N, positions per block.
        causal, key_padding_mask: as :func:`softmax_attention_reference`.
        bias: (B or 1, H or 1, L, L) a score term s_mn added to the scaled scores (a relative
            encoding's over the whole sequence); None: none.

    Returns:
        (B, L, H, E) in float64.
    """
    f64 = torch.float64
    q, k, v = q.to(f64), k.to(f64), v.to(f64)
    n = q.shape[1]
    logits = torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + bias.to(f64)
    m, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    keep = (m // block - j // block).abs() <= 1
    keep &= (j <= m) if causal else (j // block <= m // block)
    keep = reference_keep(n, n, q.device, causal=False, window=None, key_padding_mask=key_padding_mask) & keep
    weights = torch.softmax(logits.masked_fill(~keep, -math.inf), dim=-1)
    return torch.einsum("bhmn,bnhe->bmhe", weights, v)

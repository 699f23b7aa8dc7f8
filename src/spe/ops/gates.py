"""Data-dependent decay (gates: GLA, Yang et al. 2024; Mamba2/SSD, Dao & Gu 2024; FoX, Lin et al.
2025): segment sums, and the softmax (FoX) bias and reference.

Letters: B = batch, L = length, H = num_heads, M = feature dimension of φ, D = query/key
dimension, E = value dimension, G = gate channels (1: a gate per head and position; M: per
feature channel), W = window.

One convention, GLA's and Mamba2's: the gate of step t multiplies the state carried from t − 1,

    S_t = e^{G_t} S_{t−1} + φ(k_t) v_tᵀ,   z_t = e^{G_t} z_{t−1} + φ(k_t),   G_t ≤ 0,

so key n weighs exp(Σ_{t=n+1}^{m} G_t) at query m. The kernels' ``log_decay`` takes

- (H,): RetNet's constant decay, G_t = λ_h;
- (B, L, H): a gate per head and position (Mamba2, simple GLA);
- (B, L, H, M): a gate per feature channel of φ (GLA): S_t = diag(e^{G_t}) S_{t−1} + φ(k_t) v_tᵀ,

named and checked once by :func:`spe.ops.decay.forms.decode_decay`.

Softmax takes (B, L, H) as FoX: logits q_m·k_n/√D + Σ_{t=n+1}^{m} G_t.

A sum of gates is only ever exponentiated over a segment and formed from that segment's own
terms (:func:`segment_sums`, :func:`suffix_sums`; all terms ≤ 0, so no cancellation). Never
e^{F} of a running sum F_t = Σ_{s≤t} G_s (it underflows), and never F_m − F_n: once F reaches
thousands of nats that difference has lost float32's precision (10⁴ · 2⁻²⁴ ≈ 6·10⁻⁴ nats).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spe.ops.decay.forms import check_gates, is_gate  # their home since the decay forms; kept importable here

__all__ = ["check_gates", "gate_bias", "gated_softmax_reference", "is_gate", "segment_sums", "suffix_sums"]


def segment_sums(g: Tensor, dim: int) -> Tensor:
    """s_{ij} = Σ_{j < t ≤ i} g_t along ``dim`` (0 where i ≤ j), each from its own terms
    (Mamba2's stable ``segsum``): g (…, C, …) → (…, C_i, C_j, …), memory C² per slice."""
    c = g.shape[dim]
    rows = g.unsqueeze(dim + 1).expand(*g.shape[:dim + 1], c, *g.shape[dim + 1:])  # [.., i, j, ..] = g_i
    idx = torch.arange(c, device=g.device)
    after = (idx[:, None] > idx[None, :]).reshape(c, c, *([1] * (g.dim() - dim - 1)))
    return torch.cumsum(torch.where(after, rows, torch.zeros((), dtype=g.dtype, device=g.device)), dim=dim)


def suffix_sums(g: Tensor, dim: int) -> Tensor:
    """Σ_{t > n} g_t along ``dim`` (exclusive: 0 at the last index), each from its own terms:
    the log decay from position n to the end."""
    inclusive = torch.flip(torch.cumsum(torch.flip(g, (dim,)), dim), (dim,))
    return torch.cat([inclusive.narrow(dim, 1, g.shape[dim] - 1), torch.zeros_like(g.narrow(dim, 0, 1))], dim)


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

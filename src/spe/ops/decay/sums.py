"""Sums of log gates (GLA, Yang et al. 2024; Mamba2/SSD, Dao & Gu 2024; FoX, Lin et al. 2025), each
formed from its own segment's terms: what the gated kernels of linear attention and softmax's FoX
bias (:func:`spe.ops.softmax.chunk.gate_bias`) exponentiate.

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

Softmax takes (B, L, H) as FoX: logits q_m·k_n/√D + Σ_{t=n+1}^{m} G_t (:mod:`spe.ops.softmax`).

A sum of gates is only ever exponentiated over a segment and formed from that segment's own
terms (:func:`segment_sums`, :func:`suffix_sums`; all terms ≤ 0, so no cancellation). Never
e^{F} of a running sum F_t = Σ_{s≤t} G_s (it underflows), and never F_m − F_n: once F reaches
thousands of nats that difference has lost float32's precision (10⁴ · 2⁻²⁴ ≈ 6·10⁻⁴ nats).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["segment_sums", "suffix_sums"]


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

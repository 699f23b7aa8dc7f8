"""The slow, obviously correct twins of sineSPE's kernels, in one place: the blocked products
(Ω formed whole, one einsum), the filter's application to queries and keys (the gated code
formed, eq. 16-17 and 23-25), the code at per-sequence times and the learned clock's times
(both in float64).

Letters: B = batch, L = length, H = num_heads, D = head_dim, K = num_sines (J = 2K cos/sin
columns), R = num_realizations. Tests compare :class:`~spe.ops.sine.fused.FusedSineProduct` and
:class:`~spe.ops.sine.blocked.SharedSineProduct` to it, forward and backward (in float64 too).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from spe.ops.sine.phases import sine_features

__all__ = ["apply_code_reference", "apply_sine_code_timed_reference", "clock_reference",
           "sine_product_reference"]


def sine_product_reference(x: Tensor, freqs: Tensor, phases: Tensor | None, positions: Tensor, w: Tensor) -> Tensor:
    """y[b, l, h, r] = Σ_{d, j} x[b, l, h, d] Ω[l, h, d, j] W[h, d, j, r], Ω formed whole.

    Args:
        x: (B, L, H, D).
        freqs: (H, D, K) f, cycles per position.
        phases: (H, D, K) θ, or None.
        positions: (L,).
        w: (H, D, 2K, R) (the fused product takes it as (H, D·2K, R)).

    Returns:
        (B, L, H, R). Memory O(L·H·D·2K) for Ω, plus autograd's copies: for tests.
    """
    omega = sine_features(freqs, positions, phases).to(x.dtype)  # (L, H, D, 2K)
    return torch.einsum("blhd,lhdj,hdjr->blhr", x, omega, w)


def apply_code_reference(x: Tensor, bar: Tensor, gate: Tensor | None, gate_noise: Tensor) -> Tensor:
    """Straightforward eq. (16)/(17) (+ gating (23)-(25)) from a materialised code.

    The slow, obviously correct twin of :func:`~spe.ops.sine.apply.apply_code`: it forms the gated code.

    Args:
        x: (B, L, H, D) queries or keys.
        bar: (L, H, D, R) code Q̄ or K̄.
        gate: (H, D) δ in [0, 1], or None for no gating.
        gate_noise: (H, D, R) ε.

    Returns:
        (B, L, H, R): Σ_d x_d (√(1−δ_d) bar_d + √δ_d ε_d) / (D·R)^{1/4}, in x's dtype (the
        code and gate are cast to it, as in every implementation).
    """
    d, r = bar.shape[-2], bar.shape[-1]
    if gate is not None:
        bar = torch.sqrt(1 - gate)[..., None] * bar + (torch.sqrt(gate)[..., None] * gate_noise)[None]
    return torch.einsum("blhd,lhdr->blhr", x, bar.to(x.dtype)) / (d * r) ** 0.25


def apply_sine_code_timed_reference(x: Tensor, frequencies: Tensor, phases: Tensor | None, times: Tensor,
                                    weights: Tensor, gate: Tensor | None, gate_noise: Tensor) -> Tensor:
    """:func:`~spe.ops.sine.apply.apply_sine_code_timed` the straightforward way, in float64: each sequence's code
    Q̄ (B, L, H, D, R) of eq. (20)-(21) at times τ, gated as eq. (23)-(25), then applied (eq. 16/17).
    No phase reduction: cos(2π f τ + θ) in float64 (exact enough up to τ ≈ 10⁹). Returns
    (B, L, H, R) float64."""
    d, r = weights.shape[1], weights.shape[-1]
    angle = 2 * math.pi * frequencies.double() * times.double()[..., None, None]  # (B, L, H, D, K)
    if phases is not None:
        angle = angle + phases.double()
    omega = torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1).flatten(-2)
    bar = torch.einsum("blhdj,hdjr->blhdr", omega, weights.double())
    if gate is not None:
        gate = gate.double()
        bar = torch.sqrt(1 - gate)[..., None] * bar + torch.sqrt(gate)[..., None] * gate_noise.double()
    return torch.einsum("blhd,blhdr->blhr", x.double(), bar) / (d * r) ** 0.25


def clock_reference(x: Tensor, weight: Tensor, bias: Tensor, start: Tensor | None = None) -> Tensor:
    """The clock of :class:`~spe.encodings.clock.LearnedClock`, step by step in float64 (the slow twin, for tests).

    Args:
        x: (B, L, C) the layer's input.
        weight: (H, C) w; bias: (H,) b.
        start: (B, H) the time of the position before x's first (None: x starts the sequence).

    Returns:
        (B, L, H) τ in float64.
    """
    delta = F.softplus(torch.einsum("blc,hc->blh", x.double(), weight.double()) + bias.double())
    times, now = [], start
    for t in range(x.shape[1]):
        now = torch.zeros_like(delta[:, 0]) if now is None else now.double() + delta[:, t]
        times.append(now)
    return torch.stack(times, dim=1) if times else delta

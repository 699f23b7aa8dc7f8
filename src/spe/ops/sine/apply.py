"""SPE's filter applied to queries and keys: eq. (16)-(17) with gating (23)-(25) (Liutkus et
al. 2021), for a materialised code (:func:`apply_code`, any code, convSPE's too) and for sineSPE's
code formed a block at a time (:func:`apply_sine_code_fused`, :func:`apply_sine_code_blocked`) or
read at per-sequence times of a clock (:func:`apply_sine_code_timed`,
:func:`apply_sine_code_timed_pair`). Their float64 twins are in :mod:`spe.ops.sine.naive`; the
modules of :mod:`spe.encodings` hold the parameters and call these.

Letters: B = batch, L = length, H = num_heads, D = head_dim, R = num_realizations,
K = num_sines. Gating: δ (H, D) in [0, 1] and its noise ε (H, D, R), folded into x so that the
code shared by the batch stays ungated.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.sine.blocked import SharedSineProduct
from spe.ops.sine.costs import block_budget
from spe.ops.sine.fused import FusedSineProduct
from spe.ops.sine.timed import TimedSineProduct

__all__ = ["apply_code", "apply_sine_code_blocked", "apply_sine_code_fused", "apply_sine_code_timed",
           "apply_sine_code_timed_pair", "gate_term", "scaled_input"]


def scaled_input(x: Tensor, factor: Tensor | float) -> Tensor:
    """x (B, L, H, D) times a factor ((H, D) or a number), in x's dtype."""
    # formed in the wider of the two dtypes and rounded once to x's (under bf16 autocast the
    # matrix product would round it to bf16 anyway; a float64 x keeps float64)
    return (x * factor).to(x.dtype)


def gate_term(x: Tensor, gate: Tensor, gate_noise: Tensor, scale: float) -> Tensor:
    """Eq. (23)-(25)'s noise term Σ_d x_d √δ_d ε_d · ``scale``: x (B, L, H, D), gate δ (H, D),
    gate_noise ε (H, D, R) -> (B, L, H, R) in x's dtype."""
    # the gate noise is the same at every position: one (D × R) product per head
    return torch.einsum("blhd,hdr->blhr", scaled_input(x, torch.sqrt(gate)), (gate_noise * scale).to(x.dtype))


def apply_code(x: Tensor, bar: Tensor, gate: Tensor | None, gate_noise: Tensor) -> Tensor:
    """Eq. (16)/(17) with gating, the gate folded into x so the shared code stays ungated.

    Σ_d x_d (√(1−δ_d) Q̄_d + √δ_d ε_d) = Σ_d (x_d √(1−δ_d)) Q̄_d + Σ_d (x_d √δ_d) ε_d: no
    per-layer copy of the (L, H, D, R) code is made.

    Args and returns as :func:`~spe.ops.sine.naive.apply_code_reference`.
    """
    d, r = bar.shape[-2], bar.shape[-1]
    scale = (d * r) ** -0.25
    xs = scaled_input(x, scale if gate is None else torch.sqrt(1 - gate) * scale)
    out = torch.einsum("blhd,lhdr->blhr", xs, bar.to(x.dtype))
    return out if gate is None else out + gate_term(x, gate, gate_noise, scale)


def apply_sine_code_fused(x: Tensor, frequencies: Tensor, phases: Tensor | None, positions: Tensor,
                          weights: Tensor, gate: Tensor | None, gate_noise: Tensor, *,
                          block_elements: int | None = None) -> Tensor:
    """Fused sineSPE filter: one matrix product over the (D × 2K) axis per head.

    Same value as :func:`~spe.ops.sine.naive.apply_code_reference` on the materialised code, without forming the
    (L, H, D, R) code nor the (L, H, D, 2K) features Ω: q̂[m] = Σ_{d,j} (x_d Ω[m,d,j]) ·
    (λ̈_dj Z_d[j] / √(2K)) / (DR)^{1/4}, computed in blocks of positions with recomputation in
    backward, so the extra memory is O(B·L·H·R) plus one block of ``block_elements`` products.
    Costs B·L·H·D·2K·R multiply-adds (the code is recomputed for every example).

    Args:
        x: (B, L, H, D).
        frequencies: (H, D, K) f, cycles per position.
        phases: (H, D, K) θ (queries), or None (keys).
        positions: (L,) positions of x.
        weights: (H, D, 2K, R) λ̈ Z / √(2K).
        gate: (H, D) δ, or None.
        gate_noise: (H, D, R) ε.
        block_elements: size of one block of (x_d Ω) products (default 2²⁰ on a CPU, more on
            a GPU: :func:`~spe.ops.sine.costs.block_budget`).

    Returns:
        (B, L, H, R).
    """
    b, n, h, d = x.shape
    two_k, r = weights.shape[-2], weights.shape[-1]
    scale = (d * r) ** -0.25
    xs = x if gate is None else scaled_input(x, torch.sqrt(1 - gate))
    budget = block_elements if block_elements is not None else block_budget("fused", x.device)
    block = max(1, budget // max(1, b * h * d * two_k))
    w = (weights * scale).to(x.dtype).reshape(h, d * two_k, r)
    out = FusedSineProduct.apply(xs, frequencies, phases, positions, w, block)
    return out if gate is None else out + gate_term(x, gate, gate_noise, scale)


def apply_sine_code_blocked(x: Tensor, frequencies: Tensor, phases: Tensor | None, positions: Tensor,
                            weights: Tensor, gate: Tensor | None, gate_noise: Tensor, *,
                            block_elements: int | None = None) -> Tensor:
    """Batch-shared blocked sineSPE filter: each block's code is formed once for the batch.

    Same value as :func:`~spe.ops.sine.naive.apply_code_reference`. Per block of positions, the (l, H, D, R) code
    Q̄ = Ω diag(λ̈) Z / √(2K) of eq. (20)-(21) is formed once, applied to every example
    (eq. 16-17) and freed; backward forms it again. Costs L·H·D·2K·R + B·L·H·D·R multiply-adds
    (instead of the fused form's B·L·H·D·2K·R) and, beyond the (B, L, H, R) output, one block
    code of at most ``block_elements`` elements.

    Args and returns as :func:`apply_sine_code_fused`; ``block_elements`` bounds l·H·D·R
    (default 2²¹ on a CPU, more on a GPU).
    """
    b, n, h, d = x.shape
    r = weights.shape[-1]
    scale = (d * r) ** -0.25
    xs = x if gate is None else scaled_input(x, torch.sqrt(1 - gate))
    budget = block_elements if block_elements is not None else block_budget("blocked", x.device)
    block = max(1, budget // max(1, h * d * r))
    out = SharedSineProduct.apply(xs, frequencies, phases, positions, (weights * scale).to(x.dtype), block)
    return out if gate is None else out + gate_term(x, gate, gate_noise, scale)


def _timed_weights(weights: Tensor, phases: Tensor | None, scale: float, dtype: torch.dtype) -> Tensor:
    # the cos and sin halves (interleaved along 2K) of the code's weights, stacked (2, H, K·D, R)
    # in rows (k, d), with the queries' θ folded in:
    #   cos(a + θ) w_c + sin(a + θ) w_s = cos a (cos θ w_c + sin θ w_s) + sin a (cos θ w_s − sin θ w_c)
    h, d, two_k, r = weights.shape
    w = (weights * scale).view(h, d, two_k // 2, 2, r)
    w_cos, w_sin = w[..., 0, :], w[..., 1, :]
    if phases is not None:
        c, s = torch.cos(phases)[..., None], torch.sin(phases)[..., None]
        w_cos, w_sin = c * w_cos + s * w_sin, c * w_sin - s * w_cos
    return torch.stack([w_.transpose(1, 2).reshape(h, -1, r) for w_ in (w_cos, w_sin)]).to(dtype)


def _head_major(x: Tensor) -> Tensor:
    # (B, L, H, ...) -> (H, B·L, ...)
    return x.movedim(2, 0).reshape(x.shape[2], x.shape[0] * x.shape[1], *x.shape[3:])


def _batch_major(y: Tensor, b: int, n: int) -> Tensor:
    # (H, B·L, R) -> (B, L, H, R)
    return y.view(y.shape[0], b, n, y.shape[-1]).permute(1, 2, 0, 3)


def _apply_timed(sides: list[tuple[Tensor, Tensor | None]], frequencies: Tensor, times: Tensor, weights: Tensor,
                 gate: Tensor | None, gate_noise: Tensor) -> list[Tensor]:
    # one or two (x (B, L, H, D), θ or None) sides through one TimedSineProduct (one set of
    # features for both), gated as eq. (23)-(25): -> their (B, L, H, R)
    b, n, _, d = sides[0][0].shape
    scale = (d * weights.shape[-1]) ** -0.25
    inputs = []
    for x, phases in sides:
        xs = x if gate is None else scaled_input(x, torch.sqrt(1 - gate))
        inputs += [_head_major(xs), _timed_weights(weights, phases, scale, x.dtype)]
    if len(sides) == 1:
        inputs += [None, None]  # the product's second side absent
    ys = TimedSineProduct.apply(frequencies, _head_major(times), *inputs)
    outs = [_batch_major(y, b, n) for y in ys[:len(sides)]]
    if gate is not None:
        outs = [out + gate_term(x, gate, gate_noise, scale) for out, (x, _) in zip(outs, sides)]
    return outs


def apply_sine_code_timed(x: Tensor, frequencies: Tensor, phases: Tensor | None, times: Tensor,
                          weights: Tensor, gate: Tensor | None, gate_noise: Tensor) -> Tensor:
    """Eq. (16)/(17) (+ gating (23)-(25)) with the code's sinusoids read at per-sequence times τ.

    q̂[b, m] = Σ_{d,j} x_d Ω_j(τ_bmh) (λ̈_dj Z_d[j] / √(2K)) / (DR)^{1/4} with Ω the cos/sin of
    2π f_dk τ (+ θ_dk for queries), the phases reduced modulo 1 in float64, θ folded into the
    weights. The code is no longer shared by the batch: this costs B·L·H·D·2K·R multiply-adds,
    the fused index form's (:func:`apply_sine_code_fused`), instead of the
    materialised form's L·H·D·2K·R + B·L·H·D·R, and forms the cos and sin features one block of
    positions at a time, in forward and again in backward, never for the whole sequence
    (:class:`~spe.ops.sine.timed.TimedSineProduct`). Queries and keys read the same features:
    :func:`apply_sine_code_timed_pair` forms them once for both.

    Args:
        x: (B, L, H, D) queries or keys.
        frequencies: (H, D, K) f, cycles per unit of time.
        phases: (H, D, K) θ (queries), or None (keys).
        times: (B, L, H) τ (float64 keeps the phases exact at large τ).
        weights: (H, D, 2K, R) λ̈ Z / √(2K).
        gate: (H, D) δ, or None.
        gate_noise: (H, D, R) ε.

    Returns:
        (B, L, H, R) in x's dtype.
    """
    return _apply_timed([(x, phases)], frequencies, times, weights, gate, gate_noise)[0]


def apply_sine_code_timed_pair(q: Tensor, k: Tensor, frequencies: Tensor, phases: Tensor, times: Tensor,
                               weights: Tensor, gate: Tensor | None, gate_noise: Tensor) -> tuple[Tensor, Tensor]:
    """q̂ and k̂ of :func:`apply_sine_code_timed` (queries with the code's θ, keys without) from one
    set of cos and sin features: half the phase reduction and trigonometry of two calls.

    Args:
        q, k: (B, L, H, D) queries and keys.
        phases: (H, D, K) the queries' θ.
        frequencies, times, weights, gate, gate_noise: as :func:`apply_sine_code_timed`.

    Returns:
        (q̂, k̂), each (B, L, H, R) in the dtype of q and k.
    """
    q_hat, k_hat = _apply_timed([(q, phases), (k, None)], frequencies, times, weights, gate, gate_noise)
    return q_hat, k_hat

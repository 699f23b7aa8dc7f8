"""A learned clock: position measured in the data, shared by sineSPE and RoPE in learned time.

Letters: B = batch, L = length, C = d_model, H = num_heads.

Each head takes a step Δ_t = softplus(w_hᵀ x_t + b_h) ≥ 0 from the layer's input x_t and reads
the time

    τ_m = Σ_{0<t≤m} Δ_t        (τ_0 = 0),

so that τ_m − τ_n = Σ_{n<t≤m} Δ_t: the same differences as the cumulative sum Σ_{t≤m} Δ_t, the
first token's step left out so that the clock starts where the index does. A relative encoding
read at τ instead of the index m (sineSPE's phases 2π f τ_m, RoPE's angles θ_i τ_m) stays
relative, now in a time the model learns: tokens with Δ ≈ 0 share a position, as CoPE's
contextual positions do (Golovneva et al. 2024); Mamba-3's data-dependent rotary phases
advance by the same kind of step (Lahoti et al. 2026). w = 0 and b = softplus⁻¹(1) start every
head at Δ ≡ 1, τ_m = m: the index encoding.

The clock is causal in every layer (τ_m reads x_{≤m}): for encoders too, where a centred sum
would only add a constant to every τ, which a relative encoding does not see. Padding
(``key_padding_mask``) takes no step, so it never moves a real position's time.

Precision: τ is summed in float64 (a float32 sum of L steps of size ≈ 1 is off by ~L·6e-8, a
phase error of 2π f·1e-3 at L = 16,384), and the encodings reduce their phases from it in
float64 (:func:`spe.ops.sine.phases.sine_phase`, :func:`spe.encodings.rope.rotate`).

This module holds the clock's parameters; the sum is :func:`spe.ops.sine.clock.clock_times`
and its float64 twin :func:`spe.ops.sine.naive.clock_reference` (re-exported here, where it was
first public).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spe.encodings.spec import KeepsFullPrecision
from spe.ops.sine.clock import clock_times
from spe.ops.sine.naive import clock_reference  # re-exported: its earlier public path

__all__ = ["CLOCK_TIMES", "LearnedClock", "clock_reference", "inverse_softplus"]

# The time a relative encoding reads: the token index, or a learned clock.
CLOCK_TIMES = ("index", "learned")


def inverse_softplus(y: float) -> float:
    """b with softplus(b) = y (> 0): log(e^y − 1)."""
    return y + math.log(-math.expm1(-y))


class LearnedClock(KeepsFullPrecision):
    """Per-head time τ (B, L, H) from the layer's input: see the module's docstring.

    Parameters: ``weight`` (H, C) w, zeros, and ``bias`` (H,) b = softplus⁻¹(1) (Δ ≡ 1 at
    the start). Plain parameters (not an ``nn.Linear``): the models' initialisation, which
    draws every linear layer's weights, leaves them at the index clock, and weight decay
    (nn.Linear weights only) leaves them alone, as every positional parameter. They stay float32
    when a model is cast to bfloat16 or float16 (:class:`~spe.encodings.spec.KeepsFullPrecision`):
    a bf16 bias would make every step Δ 0.2 % off 1 and τ two positions off at position 1,000.

    Args:
        d_model: C.
        num_heads: H.

    Raises:
        ValueError: if a size is not a positive integer.
    """

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        for name, value in (("d_model", d_model), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LearnedClock: {name} must be a positive integer, got {value!r}")
        self.weight = nn.Parameter(torch.zeros(num_heads, d_model))
        self.bias = nn.Parameter(torch.full((num_heads,), inverse_softplus(1.0)))

    def steps(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """(B, L, H) Δ = softplus(wᵀx + b) in at least float32 (not under autocast's half
        precision: the clock sums them), 0 where ``key_padding_mask`` (B, L) is True."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(x.device.type, enabled=False):
            delta = F.softplus(F.linear(x.to(dtype), self.weight.to(dtype), self.bias.to(dtype)))
        if key_padding_mask is not None:
            delta = delta.masked_fill(key_padding_mask[..., None], 0.0)
        return delta

    def forward(self, x: Tensor, start: Tensor | None = None, *,
                key_padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The times of x's positions and the last one (the decoding state).

        Args:
            x: (B, L, C) the layer's input, L ≥ 1.
            start: (B, H) float64, the time of the position before x's first, what an earlier
                call returned (None: x starts the sequence, τ_0 = 0).
            key_padding_mask: (B, L) bool, True at padding (no step there).

        Returns:
            τ (B, L, H) and τ of the last position (B, H), both float64.

        Raises:
            ValueError: if ``start`` is not (B, H).
        """
        return clock_times(self.steps(x, key_padding_mask), start)

    def extra_repr(self) -> str:
        return f"d_model={self.weight.shape[1]}, num_heads={self.weight.shape[0]}"

"""A learned clock's times from its steps: τ_m = Σ_{0<t≤m} Δ_t, going on from a decoding state.

The clock (:class:`~spe.encodings.clock.LearnedClock`, shared by sineSPE and RoPE in learned
time) computes the steps Δ (B, L, H) from the layer's input; this is the sum that turns them
into times, in float64 (a float32 sum of L steps of size ≈ 1 is off by ~L·6e-8, a phase error
of 2π f·1e-3 at L = 16,384). Its slow twin is :func:`spe.ops.sine.naive.clock_reference`.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["clock_times"]


def clock_times(steps: Tensor, start: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The times of L positions and of the last one.

    Args:
        steps: (B, L, H) Δ ≥ 0, L ≥ 1.
        start: (B, H) the time of the position before the first (a previous call's last time);
            None: the first position starts the sequence, τ_0 = 0 (its own step not counted).

    Returns:
        τ (B, L, H) and τ of the last position (B, H), both float64.

    Raises:
        ValueError: if ``start`` is not (B, H).
    """
    delta = steps.double()
    times = delta.cumsum(dim=1)
    if start is None:
        times = times - delta[:, :1]  # τ_0 = 0: the first token's step is not counted
    else:
        if start.shape != delta.shape[::2]:
            raise ValueError(f"the clock's state must be (batch, num_heads) = {tuple(delta.shape[::2])}, "
                             f"got {tuple(start.shape)}")
        times = times + start.double()[:, None]
    return times, times[:, -1]

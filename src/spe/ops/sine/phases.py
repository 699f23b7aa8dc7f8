"""Sinusoidal features of sineSPE, accurate at large positions (shared by codes, filters and the
blocked products of :mod:`spe.ops.sine.fused` and :mod:`spe.ops.sine.blocked`)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["sine_features", "sine_phase"]


def sine_phase(frequencies: Tensor, positions: Tensor) -> Tensor:
    """Phases 2π·frac(f·n), accurate at large positions.

    A float32 product 2π f n loses about 2e-3 rad at n = 8,192; the product is therefore
    formed in float64 and reduced modulo 1 before the multiplication by 2π. The gradient with
    respect to ``frequencies`` (and to real positions) is that of 2π f n (frac has unit slope
    almost everywhere).

    Args:
        frequencies: (H, D, K) in cycles per position (or any shape that broadcasts against
            per-sequence times, below).
        positions: (L,) integer or real positions shared by the batch; or times of another
            shape, multiplied as ``times[..., None, None] * frequencies`` (a clock's times:
            :mod:`spe.ops.sine.timed` passes (H, N) times and (H, 1, K, D) frequencies).

    Returns:
        (L, H, D, K) for shared positions, else the broadcast shape (e.g. (H, N, K, D)): phases
        in radians in [0, 2π), in the dtype of ``frequencies``.
    """
    times = positions.double()
    times = times[:, None, None, None] if positions.dim() == 1 else times[..., None, None]
    cycles = frequencies.double() * times
    cycles = cycles - torch.floor(cycles).detach()
    return (2 * math.pi * cycles).to(frequencies.dtype)


def sine_features(frequencies: Tensor, positions: Tensor, phases: Tensor | None) -> Tensor:
    """Ω of eq. (19): (L, H, D, 2K), interleaved cos and sin of 2π f n (+ θ)."""
    angle = sine_phase(frequencies, positions)
    if phases is not None:
        angle = angle + phases
    return torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1).flatten(-2)

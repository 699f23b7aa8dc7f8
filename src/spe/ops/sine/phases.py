"""Sinusoidal features of sineSPE, accurate at large positions (shared by codes, filters and the
blocked products of :mod:`spe.ops.sine.fused` and :mod:`spe.ops.sine.blocked`)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["sine_features", "sine_phase", "timed_sine_features"]


def sine_phase(frequencies: Tensor, positions: Tensor) -> Tensor:
    """Phases 2π·frac(f·n), accurate at large positions.

    A float32 product 2π f n loses about 2e-3 rad at n = 8,192; the product is therefore
    formed in float64 and reduced modulo 1 before the multiplication by 2π. The gradient with
    respect to ``frequencies`` (and to real positions) is that of 2π f n (frac has unit slope
    almost everywhere).

    Args:
        frequencies: (H, D, K) in cycles per position.
        positions: (L,) integer or real positions shared by the batch, or (B, L, H) times of
            each sequence and head (a learned clock, :mod:`spe.encodings.clock`).

    Returns:
        (L, H, D, K), or (B, L, H, D, K) for per-sequence times: phases in radians in [0, 2π),
        in the dtype of ``frequencies``.
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


class _TimedTrig(torch.autograd.Function):
    # cos and sin of 2π·frac(f·τ) with a hand-written backward: autograd through the float64
    # product would keep and return (H, N, D, K) float64 gradients; here the gradient is formed
    # once in the features' dtype, d angle / d f = 2π τ and d angle / d τ = 2π f, and reduced by
    # two batched matrix products over the head-major layout.

    @staticmethod
    def forward(ctx, frequencies: Tensor, times: Tensor) -> tuple[Tensor, Tensor]:
        cycles = torch.frac(times.double()[..., None, None] * frequencies.double()[:, None])
        angle = cycles.to(frequencies.dtype) * (2 * math.pi)
        cos, sin = torch.cos(angle), torch.sin(angle)
        ctx.save_for_backward(frequencies, times, cos, sin)
        return cos, sin

    @staticmethod
    def backward(ctx, grad_cos: Tensor | None, grad_sin: Tensor | None):
        frequencies, times, cos, sin = ctx.saved_tensors
        h, n, d, k = cos.shape
        if grad_cos is None:
            grad = grad_sin * cos
        elif grad_sin is None:
            grad = -(grad_cos * sin)
        else:
            grad = grad_sin * cos - grad_cos * sin
        grad = (grad * (2 * math.pi)).view(h, n, d * k)
        grad_f = grad_t = None
        if ctx.needs_input_grad[0]:
            grad_f = torch.bmm(times.to(grad.dtype)[:, None], grad).view(h, d, k)
        if ctx.needs_input_grad[1]:
            grad_t = torch.bmm(grad, frequencies.to(grad.dtype).view(h, d * k, 1)).view(h, n).to(times.dtype)
        return grad_f, grad_t


def timed_sine_features(frequencies: Tensor, times: Tensor) -> tuple[Tensor, Tensor]:
    """cos and sin of 2π f τ at per-sequence times, the phases reduced as :func:`sine_phase`.

    The learned clock's codes differ per sequence, so these features are the learned-time path's
    largest tensors; queries and keys share them (the queries' θ goes into their weights:
    cos(a + θ) = cos a cos θ − sin a sin θ). Head-major, so that their products with the code's
    weights are batched matrix products over heads without a copy. The backward is written by
    hand so that no float64 tensor of their size is kept or formed.

    Args:
        frequencies: (H, D, K) f, cycles per unit of time.
        times: (H, N) τ of N positions (batch × length flattened) per head (float64 keeps the
            phase exact at large τ).

    Returns:
        (cos, sin), each (H, N, D, K) in the dtype of ``frequencies``; differentiable with
        respect to both arguments (frac has unit slope almost everywhere).
    """
    return _TimedTrig.apply(frequencies, times)

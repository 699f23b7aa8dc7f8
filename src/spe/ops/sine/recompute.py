"""What the blocked sineSPE products share: saving their inputs, rebuilding cos and sin of one
block of positions, the gradient buffers and the gradients through the angles.

Letters: l = positions in one block, H = num_heads, D = head_dim, K = num_sines.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spe.ops.sine.phases import sine_phase

__all__ = ["angle_grads", "cos_sin", "grad_buffers", "save_inputs", "saved_inputs"]


def angle_grads(gomega: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, gf: Tensor | None,
                gth: Tensor | None) -> None:
    """Accumulates into gf, gθ (H, D, K) the gradient through Ω = (cos a, sin a), a = 2π f n + θ.

    gomega: (l, H, D, K, 2) gradient w.r.t. (cos, sin); cos, sin: (l, H, D, K); positions: (l,).
    """
    # d cos(a)/da = −sin(a), d sin(a)/da = cos(a).
    gangle = (gomega[..., 1] * cos - gomega[..., 0] * sin).to((gf if gf is not None else gth).dtype)
    if gf is not None:
        gf += 2 * math.pi * torch.einsum("lhdk,l->hdk", gangle, positions.to(gf.dtype))
    if gth is not None:
        gth += gangle.sum(0)


def cos_sin(freqs: Tensor, phases: Tensor | None, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    angle = sine_phase(freqs, positions)
    if phases is not None:
        angle = angle + phases
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)  # (l, H, D, K) each


def save_inputs(ctx, x: Tensor, freqs: Tensor, phases: Tensor | None, positions: Tensor, w: Tensor,
                block: int) -> None:
    ctx.save_for_backward(x, freqs, phases if phases is not None else freqs.new_empty(0), positions, w)
    ctx.has_phases, ctx.block = phases is not None, block


def saved_inputs(ctx) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    x, freqs, phases, positions, w = ctx.saved_tensors
    return x, freqs, phases if ctx.has_phases else None, positions, w


def grad_buffers(ctx, x: Tensor, freqs: Tensor, phases: Tensor | None, w: Tensor):
    """Gradients to fill, None where autograd needs none: x (written per block), f, θ and W
    (accumulated over blocks; W in the layout of ``w``)."""
    need_x, need_f, need_th, _, need_w = ctx.needs_input_grad[:5]
    return (torch.empty_like(x) if need_x else None, torch.zeros_like(freqs) if need_f else None,
            torch.zeros_like(freqs) if (need_th and phases is not None) else None,
            torch.zeros_like(w) if need_w else None)

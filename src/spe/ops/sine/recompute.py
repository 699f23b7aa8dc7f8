"""What the blocked sineSPE products share: saving their inputs, the features of one block of
positions as a table of offsets and a rotation, the gradient buffers and the gradients
through the angles.

A block of positions p0 + o has angles 2π f o + (2π f p0 + θ): the features of the offsets o
(the same table for every block of equal offsets: all of them when the positions are
consecutive) rotated by the block's base angle β = 2π f p0 + θ (:func:`rotate`, K 2 × 2
rotations per (head, feature): cheap beside a block's products). The fused product folds the
rotation into its weights W, the batch-shared one turns the table (its blocks are short), so
sin and cos are evaluated for one block of offsets per call instead of for every position, in
forward and again in backward.

Letters: l = positions in one block, H = num_heads, D = head_dim, K = num_sines.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from spe.ops.sine.phases import sine_features, sine_phase

__all__ = ["angle_grads", "grad_buffers", "offset_blocks", "rotate", "save_inputs", "saved_inputs"]


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


def offset_blocks(freqs: Tensor, phases: Tensor | None, positions: Tensor, block: int, dtype: torch.dtype,
                  layout: Callable[[Tensor], Tensor]):
    """Yields (s, e, table, cos β, sin β) per block of positions s:e.

    table = ``layout`` of Ω of the offsets positions[s:e] − positions[s] ((l, H, D, 2K),
    interleaved cos and sin of 2π f o), evaluated again only when a block's offsets differ
    from the previous block's; cos β, sin β: (H, D, K) in ``dtype``, β = 2π f positions[s] + θ
    (phases reduced in float64, :func:`~spe.ops.sine.phases.sine_phase`).
    """
    n = positions.shape[0]
    offsets = features = table = None
    for s in range(0, n, block):
        e = min(n, s + block)
        o = positions[s:e].double() - positions[s].double()
        if offsets is None or not torch.equal(o, offsets[:e - s]):
            offsets, features = o, sine_features(freqs, o, None).to(dtype)
            table = layout(features)
        elif e - s < offsets.shape[0]:  # a shorter last block: a prefix of the table
            offsets, features = o, features[:e - s]
            table = layout(features)
        base = sine_phase(freqs, positions[s:s + 1])[0]  # (H, D, K)
        base = base if phases is None else base + phases
        yield s, e, table, torch.cos(base).to(dtype), torch.sin(base).to(dtype)


def rotate(w: Tensor, axis: int, cos_b: Tensor, sin_b: Tensor, inverse: bool = False) -> Tensor:
    """W' with cos a W'_c + sin a W'_s = cos(a + β) W_c + sin(a + β) W_s, the (cos, sin) pair
    of W on ``axis`` and cos β, sin β broadcastable to W's other axes; ``inverse``: the
    transpose, which maps the gradient of W' to that of W."""
    wc, ws = w.select(axis, 0), w.select(axis, 1)
    sin_b = -sin_b if inverse else sin_b
    return torch.stack([cos_b * wc + sin_b * ws, cos_b * ws - sin_b * wc], dim=axis)


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

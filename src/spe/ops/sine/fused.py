"""Blocked sineSPE products that never store the (L, H, D, R) code nor the features Ω.

Letters: B = batch, L = length (l: one block of positions), H = num_heads, D = head_dim,
K = num_sines (J = 2K cos/sin columns), R = num_realizations.

Both compute, for x (B, L, H, D), features Ω (L, H, D, 2K) of eq. (19) and weights
W (H, D, 2K, R) (λ̈ Z, scaled):

    y[b, l, h, r] = Σ_{d, j} x[b, l, h, d] · Ω[l, h, d, j] · W[h, d, j, r],

one block of positions at a time, rebuilding Ω (and the code) from f, θ and the positions
in backward instead of storing them; both read one table of offsets and turn it, or W, by
each block's base angle (:func:`~spe.ops.sine.recompute.offset_blocks`). They differ in the
order of the sums:

* :class:`FusedSineProduct` forms (x_d Ω_dj) per example and multiplies by W: one GEMM
  with inner size D·2K per head, B·L·H·D·2K·R multiply-adds.
* :class:`~spe.ops.sine.blocked.SharedSineProduct` forms the block's code
  C[l, h, d, r] = Σ_j Ω W once, shared by the whole batch, then applies it to every example:
  L·H·D·2K·R + B·L·H·D·R multiply-adds.

Their slow, obviously correct twin :func:`~spe.ops.sine.naive.sine_product_reference` forms Ω
for every position and sums with one einsum; tests compare both products to it, forward and backward. Which of
them ``impl="auto"`` picks is the cost model's business (:mod:`spe.ops.sine.costs`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.sine.recompute import angle_grads, grad_buffers, offset_blocks, rotate, save_inputs, saved_inputs

__all__ = ["FusedSineProduct"]


class FusedSineProduct(torch.autograd.Function):
    """y[b,l,h,r] = Σ_i (x[b,l,h,d(i)] · Ω[l,h,i]) W[h,i,r] over i = (d, j), in blocks of positions.

    Ω (eq. 19) is never formed for the whole length: each block reads one table of offsets and
    rotates W by its base angle (:func:`~spe.ops.sine.recompute.offset_blocks`). Inside, the
    products are laid out (j, d), head_dim innermost, so that the elementwise passes run along
    D rather than along 2K. The (B, l, H, 2K·D) products are recomputed in backward: extra
    memory is one block plus the (B, L, H, R) output, whatever the length. Gradients flow to
    x, f, θ and W.
    """

    @staticmethod
    def forward(ctx, x: Tensor, freqs: Tensor, phases: Tensor | None, positions: Tensor, w: Tensor,
                block: int) -> Tensor:
        b, n, h, d = x.shape
        r = w.shape[-1]
        wt = _to_jd(w, d)
        out = x.new_empty(b, n, h, r)
        for s, e, table, cb, sb in offset_blocks(freqs, phases, positions, block, x.dtype, _table):
            feats = x[:, s:e].permute(2, 0, 1, 3)[:, :, :, None] * table[:, None]  # (H, B, l, 2K, D)
            # (H, B·l, R); the sizes are explicit because B = 0 leaves a −1 ambiguous
            y = torch.bmm(feats.reshape(h, b * (e - s), wt.shape[1]), _rotate(wt, cb, sb))
            out[:, s:e] = y.view(h, b, e - s, r).permute(1, 2, 0, 3)
        save_inputs(ctx, x, freqs, phases, positions, w, block)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, freqs, phases, positions, w = saved_inputs(ctx)
        b, n, h, d = x.shape
        k, r = freqs.shape[-1], w.shape[-1]
        gx, gf, gth, gw = grad_buffers(ctx, x, freqs, phases, w)
        wt = _to_jd(w, d)
        gwt = torch.zeros_like(wt) if gw is not None else None
        for s, e, table, cb, sb in offset_blocks(freqs, phases, positions, ctx.block, x.dtype, _table):
            l = e - s
            xb = x[:, s:e].permute(2, 0, 1, 3)[:, :, :, None]  # (H, B, l, 1, D)
            g = grad[:, s:e].permute(2, 0, 1, 3).reshape(h, b * l, r)  # (H, B·l, R)
            if gwt is not None:  # the gradient of the rotated W, rotated back
                feats = (xb * table[:, None]).reshape(h, b * l, 2 * k * d)
                gwt += _rotate(torch.bmm(feats.transpose(1, 2), g), cb, sb, inverse=True)
            gfeats = torch.bmm(g, _rotate(wt, cb, sb).transpose(1, 2)).view(h, b, l, 2 * k, d)
            if gx is not None:
                gx[:, s:e] = (gfeats * table[:, None]).sum(3).permute(1, 2, 0, 3)
            if gf is not None or gth is not None:
                # d/dA of the block's terms = d/do of the rotated ones: angle_grads sees the
                # offsets' cos and sin and the positions themselves
                gomega = (gfeats * xb).sum(1).view(h, l, k, 2, d).permute(1, 0, 4, 2, 3)  # (l, H, D, K, 2)
                cos, sin = table.view(h, l, k, 2, d).permute(3, 1, 0, 4, 2)  # (l, H, D, K) each
                angle_grads(gomega, cos, sin, positions[s:e], gf, gth)
        if gw is not None:
            gw.copy_(gwt.view(h, k, 2, d, r).permute(0, 3, 1, 2, 4).reshape_as(gw))
        return gx, gf, gth, None, gw, None


def _table(features: Tensor) -> Tensor:
    """Ω (l, H, D, 2K) -> (H, l, 2K, D)."""
    return features.permute(1, 0, 3, 2).contiguous()


def _to_jd(w: Tensor, d: int) -> Tensor:
    """W (H, D·2K, R) in rows (d, j) -> (H, 2K·D, R) in rows (j, d)."""
    h, i, r = w.shape
    return w.view(h, d, i // d, r).transpose(1, 2).reshape(h, i, r)


def _rotate(wt: Tensor, cb: Tensor, sb: Tensor, inverse: bool = False) -> Tensor:
    """:func:`~spe.ops.sine.recompute.rotate` of W (H, 2K·D, R) in rows (j, d); cb, sb (H, D, K)."""
    h, i, r = wt.shape
    k = cb.shape[-1]
    pairs = wt.view(h, k, 2, i // (2 * k), r)
    cb, sb = cb.transpose(1, 2)[..., None], sb.transpose(1, 2)[..., None]  # (H, K, D, 1)
    return rotate(pairs, 2, cb, sb, inverse).view(h, i, r)

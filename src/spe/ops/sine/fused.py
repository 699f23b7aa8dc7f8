"""Blocked sineSPE products that never store the (L, H, D, R) code nor the features Ω.

Letters: B = batch, L = length (l: one block of positions), H = num_heads, D = head_dim,
K = num_sines (J = 2K cos/sin columns), R = num_realizations.

Both compute, for x (B, L, H, D), features Ω (L, H, D, 2K) of eq. (19) and weights
W (H, D, 2K, R) (λ̈ Z, scaled):

    y[b, l, h, r] = Σ_{d, j} x[b, l, h, d] · Ω[l, h, d, j] · W[h, d, j, r],

one block of positions at a time, rebuilding Ω (and the code) from f, θ and the positions
in backward instead of storing them. They differ in the order of the sums:

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

from spe.ops.sine.phases import sine_features
from spe.ops.sine.recompute import angle_grads, cos_sin, grad_buffers, save_inputs, saved_inputs

__all__ = ["FusedSineProduct"]


class FusedSineProduct(torch.autograd.Function):
    """y[b,l,h,r] = Σ_i (x[b,l,h,d(i)] · Ω[l,h,i]) W[h,i,r] over i = (d, j), in blocks of positions.

    Ω (eq. 19) is built one block of positions at a time from f, θ and the positions, in
    forward and again in backward (recomputation instead of storage), as are the
    (B, l, H, D·2K) products: extra memory is one block plus the (B, L, H, R) output,
    whatever the length. Gradients flow to x, f, θ and W.
    """

    @staticmethod
    def forward(ctx, x: Tensor, freqs: Tensor, phases: Tensor | None, positions: Tensor, w: Tensor,
                block: int) -> Tensor:
        b, n, h, d = x.shape
        r = w.shape[-1]
        out = x.new_empty(b, n, h, r)
        for s in range(0, n, block):
            e = min(n, s + block)
            omega = sine_features(freqs, positions[s:e], phases).to(x.dtype)  # (l, H, D, 2K)
            feats = x[:, s:e].permute(2, 0, 1, 3)[..., None] * omega.permute(1, 0, 2, 3)[:, None]
            # (H, B·l, R); the sizes are explicit because B = 0 leaves a −1 ambiguous
            y = torch.bmm(feats.reshape(h, b * (e - s), w.shape[1]), w)
            out[:, s:e] = y.view(h, b, e - s, r).permute(1, 2, 0, 3)
        save_inputs(ctx, x, freqs, phases, positions, w, block)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, freqs, phases, positions, w = saved_inputs(ctx)
        b, n, h, d = x.shape
        k, r = freqs.shape[-1], w.shape[-1]
        gx, gf, gth, gw = grad_buffers(ctx, x, freqs, phases, w)
        for s in range(0, n, ctx.block):
            e = min(n, s + ctx.block)
            cos, sin = cos_sin(freqs, phases, positions[s:e], x.dtype)  # (l, H, D, K)
            ob = torch.stack([cos, sin], dim=-1).flatten(-2).permute(1, 0, 2, 3)  # (H, l, D, 2K)
            xb = x[:, s:e].permute(2, 0, 1, 3)  # (H, B, l, D)
            g = grad[:, s:e].permute(2, 0, 1, 3).reshape(h, b * (e - s), r)  # (H, B·l, R)
            if gw is not None:
                feats = (xb[..., None] * ob[:, None]).reshape(h, b * (e - s), d * 2 * k)
                gw += torch.bmm(feats.transpose(1, 2), g)
            gfeats = torch.bmm(g, w.transpose(1, 2)).view(h, b, e - s, d, 2 * k)
            if gx is not None:
                gx[:, s:e] = (gfeats * ob[:, None]).sum(-1).permute(1, 2, 0, 3)
            if gf is not None or gth is not None:
                gomega = (gfeats * xb[..., None]).sum(1).view(h, e - s, d, k, 2).permute(1, 0, 2, 3, 4)
                angle_grads(gomega, cos, sin, positions[s:e], gf, gth)
        return gx, gf, gth, None, gw, None

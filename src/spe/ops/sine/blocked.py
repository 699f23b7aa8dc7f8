"""The batch-shared blocked sineSPE product: each block's code formed once for the whole batch.

Letters: B = batch, L = length (l: one block of positions), H = num_heads, D = head_dim,
K = num_sines (J = 2K), R = num_realizations. What it computes, and how it differs from
:class:`~spe.ops.sine.fused.FusedSineProduct`: :mod:`spe.ops.sine.fused`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.sine.recompute import angle_grads, grad_buffers, offset_blocks, rotate, save_inputs, saved_inputs

__all__ = ["SharedSineProduct"]


class SharedSineProduct(torch.autograd.Function):
    """y[b,l,h,r] = Σ_d x[b,l,h,d] C[l,h,d,r] with the block code C = Σ_j Ω[l,h,d,j] W[h,d,j,r].

    Per block of positions the (l, H, D, R) code is formed once for the whole batch, applied
    to every example and freed; backward forms it again (recomputation instead of storage).
    Extra memory: one block code plus the (B, L, H, R) output, whatever the length.

    Args (of ``apply``): x (B, L, H, D); freqs (H, D, K); phases (H, D, K) or None;
    positions (L,); w (H, D, 2K, R); block (positions per block).
    """

    @staticmethod
    def forward(ctx, x: Tensor, freqs: Tensor, phases: Tensor | None, positions: Tensor, w: Tensor,
                block: int) -> Tensor:
        b, n, h, d = x.shape
        r = w.shape[-1]
        w2 = w.reshape(h * d, -1, r)  # (H·D, 2K, R)
        out = x.new_empty(b, n, h, r)
        for s, e, table, cb, sb in offset_blocks(freqs, phases, positions, block, x.dtype, _table):
            code = _block_code(_features(table, cb, sb), w2, h)  # (H·l, D, R)
            xb = x[:, s:e].permute(2, 1, 0, 3).reshape(h * (e - s), b, d)  # (H·l, B, D)
            out[:, s:e] = torch.bmm(xb, code).view(h, e - s, b, r).permute(2, 1, 0, 3)
        save_inputs(ctx, x, freqs, phases, positions, w, block)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, freqs, phases, positions, w = saved_inputs(ctx)
        b, n, h, d = x.shape
        k, r = freqs.shape[-1], w.shape[-1]
        w2 = w.reshape(h * d, 2 * k, r)
        gx, gf, gth, gw = grad_buffers(ctx, x, freqs, phases, w2)
        for s, e, table, cb, sb in offset_blocks(freqs, phases, positions, ctx.block, x.dtype, _table):
            l = e - s
            omega = _features(table, cb, sb)  # (H·D, l, 2K)
            code = _block_code(omega, w2, h)
            g = grad[:, s:e].permute(2, 1, 0, 3).reshape(h * l, b, r)  # (H·l, B, R)
            if gx is not None:
                gx[:, s:e] = torch.bmm(g, code.transpose(1, 2)).view(h, l, b, d).permute(2, 1, 0, 3)
            if gw is None and gf is None and gth is None:
                continue
            xb = x[:, s:e].permute(2, 1, 3, 0).reshape(h * l, d, b)  # (H·l, D, B)
            gcode = torch.bmm(xb, g).view(h, l, d, r).transpose(1, 2).reshape(h * d, l, r)  # (H·D, l, R)
            if gw is not None:
                gw += torch.bmm(omega.transpose(1, 2), gcode)
            if gf is not None or gth is not None:
                gomega = torch.bmm(gcode, w2.transpose(1, 2)).view(h, d, l, k, 2).permute(2, 0, 1, 3, 4)
                cos, sin = omega.view(h, d, l, k, 2).permute(4, 2, 0, 1, 3)  # (l, H, D, K) each
                angle_grads(gomega, cos, sin, positions[s:e], gf, gth)
        return gx, gf, gth, None, None if gw is None else gw.view_as(w), None


def _table(features: Tensor) -> Tensor:
    """Ω (l, H, D, 2K) -> (H·D, l, 2K)."""
    l, h, d, j = features.shape
    return features.permute(1, 2, 0, 3).reshape(h * d, l, j)


def _features(table: Tensor, cb: Tensor, sb: Tensor) -> Tensor:
    """Ω of the block's positions, (H·D, l, 2K): the table of offsets turned by the base angle
    (the blocks here are short, l ≈ R, so turning the features costs what turning W would)."""
    hd, l, j = table.shape
    pairs = table.view(hd, l, j // 2, 2)
    # cos(a + β) = cos a cos β − sin a sin β, sin(a + β) = sin a cos β + cos a sin β: the
    # transpose of the rotation that turns W
    return rotate(pairs, 3, cb.reshape(hd, 1, -1), sb.reshape(hd, 1, -1), inverse=True).view(hd, l, j)


def _block_code(omega: Tensor, w2: Tensor, h: int) -> Tensor:
    """The code of one block, (H·l, D, R), from its features Ω (H·D, l, 2K) and W (H·D, 2K, R)."""
    hd, l, _ = omega.shape
    return torch.bmm(omega, w2).view(h, hd // h, l, -1).transpose(1, 2).reshape(h * l, hd // h, -1)

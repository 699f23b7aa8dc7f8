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
* :class:`SharedSineProduct` forms the block's code C[l, h, d, r] = Σ_j Ω W once, shared by
  the whole batch, then applies it to every example: L·H·D·2K·R + B·L·H·D·R multiply-adds.

Their slow, obviously correct twin :func:`sine_product_reference` forms Ω for every position
and sums with one einsum; tests compare both products to it, forward and backward. Which of
them ``impl="auto"`` picks is the cost model's business (:mod:`spe.ops.sine_costs`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spe.ops.phases import sine_features, sine_phase

__all__ = ["FusedSineProduct", "SharedSineProduct", "sine_product_reference"]


def sine_product_reference(x: Tensor, freqs: Tensor, phases: Tensor | None, positions: Tensor, w: Tensor) -> Tensor:
    """y[b, l, h, r] = Σ_{d, j} x[b, l, h, d] Ω[l, h, d, j] W[h, d, j, r], Ω formed whole.

    Args:
        x: (B, L, H, D).
        freqs: (H, D, K) f, cycles per position.
        phases: (H, D, K) θ, or None.
        positions: (L,).
        w: (H, D, 2K, R) (the fused product takes it as (H, D·2K, R)).

    Returns:
        (B, L, H, R). Memory O(L·H·D·2K) for Ω, plus autograd's copies: for tests.
    """
    omega = sine_features(freqs, positions, phases).to(x.dtype)  # (L, H, D, 2K)
    return torch.einsum("blhd,lhdj,hdjr->blhr", x, omega, w)


def _angle_grads(gomega: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, gf: Tensor | None,
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


def _cos_sin(freqs: Tensor, phases: Tensor | None, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    angle = sine_phase(freqs, positions)
    if phases is not None:
        angle = angle + phases
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)  # (l, H, D, K) each


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
        _save(ctx, x, freqs, phases, positions, w, block)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, freqs, phases, positions, w = _saved(ctx)
        b, n, h, d = x.shape
        k, r = freqs.shape[-1], w.shape[-1]
        gx, gf, gth, gw = _grad_buffers(ctx, x, freqs, phases, w)
        for s in range(0, n, ctx.block):
            e = min(n, s + ctx.block)
            cos, sin = _cos_sin(freqs, phases, positions[s:e], x.dtype)  # (l, H, D, K)
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
                _angle_grads(gomega, cos, sin, positions[s:e], gf, gth)
        return gx, gf, gth, None, gw, None


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
        for s in range(0, n, block):
            e = min(n, s + block)
            code = _block_code(freqs, phases, positions[s:e], w2, x.dtype)[0]  # (H·l, D, R)
            xb = x[:, s:e].permute(2, 1, 0, 3).reshape(h * (e - s), b, d)  # (H·l, B, D)
            out[:, s:e] = torch.bmm(xb, code).view(h, e - s, b, r).permute(2, 1, 0, 3)
        _save(ctx, x, freqs, phases, positions, w, block)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, freqs, phases, positions, w = _saved(ctx)
        b, n, h, d = x.shape
        k, r = freqs.shape[-1], w.shape[-1]
        w2 = w.reshape(h * d, 2 * k, r)
        gx, gf, gth, gw = _grad_buffers(ctx, x, freqs, phases, w2)
        for s in range(0, n, ctx.block):
            e = min(n, s + ctx.block)
            l = e - s
            code, omega, cos, sin = _block_code(freqs, phases, positions[s:e], w2, x.dtype)
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
                _angle_grads(gomega, cos, sin, positions[s:e], gf, gth)
        return gx, gf, gth, None, None if gw is None else gw.view_as(w), None


def _save(ctx, x: Tensor, freqs: Tensor, phases: Tensor | None, positions: Tensor, w: Tensor, block: int) -> None:
    ctx.save_for_backward(x, freqs, phases if phases is not None else freqs.new_empty(0), positions, w)
    ctx.has_phases, ctx.block = phases is not None, block


def _saved(ctx) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    x, freqs, phases, positions, w = ctx.saved_tensors
    return x, freqs, phases if ctx.has_phases else None, positions, w


def _grad_buffers(ctx, x: Tensor, freqs: Tensor, phases: Tensor | None, w: Tensor):
    """Gradients to fill, None where autograd needs none: x (written per block), f, θ and W
    (accumulated over blocks; W in the layout of ``w``)."""
    need_x, need_f, need_th, _, need_w = ctx.needs_input_grad[:5]
    return (torch.empty_like(x) if need_x else None, torch.zeros_like(freqs) if need_f else None,
            torch.zeros_like(freqs) if (need_th and phases is not None) else None,
            torch.zeros_like(w) if need_w else None)


def _block_code(freqs: Tensor, phases: Tensor | None, positions: Tensor, w2: Tensor, dtype: torch.dtype):
    """The code of one block of l positions, laid out for the per-(head, position) products.

    Returns:
        code (H·l, D, R); Ω (H·D, l, 2K); cos and sin (l, H, D, K).
    """
    h, d, k = freqs.shape
    l = positions.shape[0]
    cos, sin = _cos_sin(freqs, phases, positions, dtype)
    omega = torch.stack([cos, sin], dim=-1).permute(1, 2, 0, 3, 4).reshape(h * d, l, 2 * k)  # (H·D, l, 2K)
    code = torch.bmm(omega, w2).view(h, d, l, -1).transpose(1, 2).reshape(h * l, d, -1)
    return code, omega, cos, sin

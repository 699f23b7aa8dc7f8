"""Applying a convSPE code to queries and keys one block of positions at a time.

Letters: B = batch, L = length (l: one block), H = num_heads, D = head_dim, R =
num_realizations, P = kernel_size, N = l + P − 1 the block's noise span and FFT size.

The materialised form keeps two (L, H, D, R) codes, their spectra and their gradients: about
five code-sized tensors, 537 MB each at L = 4,096, H = 8, D = 64, R = 64. Here only the noise
(one code-sized tensor, shared by queries, keys and every layer) is kept: per block of l
positions, the noise span of N = l + P − 1 samples is filtered into the block's codes (one FFT
of the span for both filters), applied, and freed; backward forms the block's codes again.

Where the time goes, and why it is laid out so (one thread, B = 2, L = 8,192, H = 4, D = 64,
R = 32, P = 64): applying a time-last code by broadcast products and a sum over D cost more
than the FFTs (the products of every layer, forward and backward, were over half of a whole
model's step). Each block's codes are therefore turned time-first by one 2-D transpose of the
whole span (PyTorch's blocked transpose copy; a 4-D permute of the sliced view was 4× slower)
and applied by batched matrix products over (position, head). N is a power of two (the
5-smooth lengths around 2,000 were measured 1.7× slower per sample).

Backward is written out rather than left to autograd: the noise spectrum of the block is
formed once and serves both the codes (for the gradients to queries and keys) and the
filters' gradients, summed over blocks in the frequency domain and transformed back once:
  ∂/∂Φ[h, d, p] = Σ_{t, r} G[t, h, d, r] Z[h, d, r, t + P − 1 − p],  G[t, h, d, r] = Σ_b x[b, t, h, d] g[b, t, h, r],
a cross-correlation of each block's G (shifted by P − 1) with its noise span, so
irfft(Ĝ · conj(Ẑ))[p] for p < P with no wrap-around.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.conv.filters import (BLOCK_ELEMENTS, add_filter_grad, block_length, direct_filter, filter_grad,
                                  filter_spectrum, new_filter_spectrum, span_code)

__all__ = ["block_length", "conv_code_product"]


def _apply(x: Tensor, code: Tensor) -> Tensor:
    # Σ_d x[b, t, h, d] C[t, h, d, r]: one (B × D)·(D × R) product per (position, head)
    return torch.matmul(x.permute(1, 2, 0, 3), code.to(x.dtype)).permute(2, 0, 1, 3)  # (B, l, H, R)


def _spectra(z: Tensor, fq: Tensor, fk: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """(Ẑ, Φ̂^Q, Φ̂^K) of one noise span and the filters at FFT size n."""
    return torch.fft.rfft(z, n=n), filter_spectrum(fq, n), filter_spectrum(fk, n)


def _products(queries: Tensor, keys: Tensor, z: Tensor, p: int, block: int, codes) -> tuple[Tensor, Tensor]:
    """q̂, k̂ (B, L, H, R), block by block: ``codes(noise span, l)`` gives the block's (l, H, D, R) Q̄, K̄."""
    b, length, h, _ = queries.shape
    r = z.shape[2]
    out_q, out_k = queries.new_empty(b, length, h, r), keys.new_empty(b, length, h, r)
    for s in range(0, length, block):
        e = min(length, s + block)
        cq, ck = codes(z[..., s:e + p - 1], e - s)
        out_q[:, s:e], out_k[:, s:e] = _apply(queries[:, s:e], cq), _apply(keys[:, s:e], ck)
    return out_q, out_k


class _ConvCodeProductFFT(torch.autograd.Function):
    """Both products, block by block, the codes filtered by FFT; backward forms each block's
    codes again and writes the block's gradients into whole-length buffers."""

    @staticmethod
    def forward(ctx, queries: Tensor, keys: Tensor, z: Tensor, fq: Tensor, fk: Tensor,
                block: int) -> tuple[Tensor, Tensor]:
        n, p = block + fq.shape[-1] - 1, fq.shape[-1]

        def codes(span: Tensor, l: int) -> tuple[Tensor, Tensor]:
            zf, fqf, fkf = _spectra(span, fq, fk, n)
            return span_code(zf, fqf, n, p, l), span_code(zf, fkf, n, p, l)

        with torch.no_grad():
            out_q, out_k = _products(queries, keys, z, p, block, codes)
        ctx.save_for_backward(queries, keys, z, fq, fk)
        ctx.block = block
        return out_q, out_k

    @staticmethod
    def backward(ctx, grad_q: Tensor, grad_k: Tensor):
        queries, keys, z, fq, fk = ctx.saved_tensors
        length, p, block = queries.shape[1], fq.shape[-1], ctx.block
        # an expanded gradient (of a sum) would make every per-(position, head) product copy its slice
        grad_q, grad_k = grad_q.contiguous(), grad_k.contiguous()
        n = block + p - 1
        need_q, need_k, _, need_fq, need_fk = ctx.needs_input_grad[:5]
        gq = torch.empty_like(queries) if need_q else None
        gk = torch.empty_like(keys) if need_k else None
        # Σ over blocks of Σ_r Ĝ conj(Ẑ): the filters' gradients, in the frequency domain
        sq, sk = (new_filter_spectrum(fq, n) if need else None for need in (need_fq, need_fk))
        for s in range(0, length, block):
            e = min(length, s + block)
            zf, fqf, fkf = _spectra(z[..., s:e + p - 1], fq, fk, n)
            for x, g, ff, grad_x, spec in ((queries, grad_q, fqf, gq, sq), (keys, grad_k, fkf, gk, sk)):
                if grad_x is None and spec is None:
                    continue
                xs, gs = x[:, s:e].permute(1, 2, 0, 3), g[:, s:e].permute(1, 2, 0, 3)  # (l, H, B, ·)
                if grad_x is not None:
                    code = span_code(zf, ff, n, p, e - s).to(x.dtype)
                    grad_x[:, s:e] = torch.matmul(gs, code.transpose(-1, -2)).permute(2, 0, 1, 3)
                if spec is not None:
                    add_filter_grad(spec, zf, torch.matmul(xs.transpose(-1, -2), gs), n)  # G (l, H, D, R)
        gfq = filter_grad(sq, n, p) if sq is not None else None
        gfk = filter_grad(sk, n, p) if sk is not None else None
        return gq, gk, None, gfq, gfk, None


class _ConvCodeProductDirect(torch.autograd.Function):
    """The twin with codes filtered by direct convolution: backward forms each block again and
    differentiates it alone (its inputs detached)."""

    @staticmethod
    def forward(ctx, queries: Tensor, keys: Tensor, z: Tensor, fq: Tensor, fk: Tensor,
                block: int) -> tuple[Tensor, Tensor]:
        out_q, out_k = _products(queries, keys, z, fq.shape[-1], block, lambda span, l: direct_filter(span, [fq, fk]))
        ctx.save_for_backward(queries, keys, z, fq, fk)
        ctx.block = block
        return out_q, out_k

    @staticmethod
    def backward(ctx, grad_q: Tensor, grad_k: Tensor):
        queries, keys, z, fq, fk = ctx.saved_tensors
        length, p = queries.shape[1], fq.shape[-1]
        need = ctx.needs_input_grad
        grads = [torch.empty_like(queries) if need[0] else None, torch.empty_like(keys) if need[1] else None,
                 torch.zeros_like(fq) if need[3] else None, torch.zeros_like(fk) if need[4] else None]
        for s in range(0, length, ctx.block):
            e = min(length, s + ctx.block)
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_() for t in (queries[:, s:e], keys[:, s:e], fq, fk)]
                cq, ck = direct_filter(z[..., s:e + p - 1], leaves[2:])
                outs = (_apply(leaves[0], cq), _apply(leaves[1], ck))
                block_grads = torch.autograd.grad(outs, leaves, (grad_q[:, s:e], grad_k[:, s:e]))
            for i in (0, 1):
                if grads[i] is not None:
                    grads[i][:, s:e] = block_grads[i]
            for i in (2, 3):
                if grads[i] is not None:
                    grads[i] += block_grads[i]
        return grads[0], grads[1], None, grads[2], grads[3], None


def conv_code_product(queries: Tensor, keys: Tensor, z: Tensor, filters_q: Tensor, filters_k: Tensor, *,
                      use_fft: bool = True, block_elements: int = BLOCK_ELEMENTS) -> tuple[Tensor, Tensor]:
    """q̂ = Σ_d x_d Q̄_d and k̂ = Σ_d x_d K̄_d (eq. 16-17) with Q̄, K̄ filtered noise (eq. 22),
    never forming the whole codes.

    Args:
        queries, keys: (B, L, H, D), already scaled (and gated) by the caller.
        z: (H, D, R, L + P − 1) noise, time last: position t's code filters samples t … t + P − 1
            (:meth:`spe.ConvSPE.noise_span` of the first position − P + 1); no gradient flows to it.
        filters_q, filters_k: (H, D, P) Φ^Q, Φ^K.
        use_fft: filter each block by FFT (True) or by direct convolution.
        block_elements: the most elements of one block's code (l·H·D·R), unless a block of
            :func:`block_length`'s least size (a span of 4P) is larger.

    Returns:
        q̂ (B, L, H, R) and k̂ (B, L, H, R), in the dtypes of queries and keys.

    Raises:
        ValueError: if the shapes do not fit each other.
    """
    b, n, h, d = queries.shape
    p = filters_q.shape[-1]
    if keys.shape != queries.shape or z.shape[:2] != (h, d) or z.shape[-1] != n + p - 1 \
            or filters_q.shape != (h, d, p) or filters_k.shape != (h, d, p):
        raise ValueError(f"conv_code_product: queries {tuple(queries.shape)}, keys {tuple(keys.shape)}, "
                         f"noise {tuple(z.shape)} and filters {tuple(filters_q.shape)}/{tuple(filters_k.shape)} "
                         "do not fit: noise must be (H, D, R, L + P − 1), filters (H, D, P)")
    r = z.shape[2]
    block = block_length(block_elements // max(1, h * d * r), p, n)
    product = _ConvCodeProductFFT if use_fft else _ConvCodeProductDirect
    # where the least span (4P samples) of every head exceeds the budget, groups of heads in turn:
    # a span's temporaries (its spectrum, codes and their transposes) then stay cache-sized
    # (one product forward + backward at B 2, L 4,096, 8 × 64 features, R 64, P 128, one thread:
    # 17 s all heads at once, 7.7-8.9 s in groups of 2, under load)
    group = max(1, block_elements // max(1, (block + p - 1) * d * r))
    if group >= h:
        return product.apply(queries, keys, z.detach(), filters_q, filters_k, block)
    outs = [product.apply(queries[:, :, i:i + group], keys[:, :, i:i + group], z[i:i + group].detach(),
                          filters_q[i:i + group], filters_k[i:i + group], block) for i in range(0, h, group)]
    return torch.cat([o[0] for o in outs], dim=2), torch.cat([o[1] for o in outs], dim=2)

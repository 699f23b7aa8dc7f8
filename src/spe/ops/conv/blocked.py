"""Applying a convSPE code to queries and keys one block of positions at a time.

Letters: B = batch, L = length (l: one block), H = num_heads, D = head_dim, R =
num_realizations, P = kernel_size.

The materialised form keeps two (L, H, D, R) codes, their spectra and their gradients: about
five code-sized tensors, 537 MB each at L = 4,096, H = 8, D = 64, R = 64. Here only the noise
(one code-sized tensor, shared by queries, keys and every layer) is kept: per block of l
positions, the noise span of l + P − 1 samples is filtered into the block's codes (one FFT of
the noise for both filters), applied, and freed; backward forms the block again
(activation checkpointing, so autograd differentiates the same operations as forward: the
gradients to x and to both filters are exact by construction).
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.conv.filters import direct_filter, fft_filter_time_last, fft_size

__all__ = ["block_length", "conv_code_product"]


def _apply(x: Tensor, code: Tensor) -> Tensor:
    # Σ_d x[b, t, h, d] C[h, d, r, t] on the time-last code as the FFT leaves it: transposing the
    # code to (t, H, D, R) for a batched matrix product cost more than the products themselves
    # (a strided copy of the whole block, and 2·l·H tiny products per block at B = 2).
    xt = x.permute(0, 2, 3, 1)[:, :, :, None, :]  # (B, H, D, 1, l)
    return (xt * code.to(x.dtype)).sum(2).permute(0, 3, 1, 2)  # (B, l, H, R)


def _block(xq: Tensor, xk: Tensor, z: Tensor, fq: Tensor, fk: Tensor, use_fft: bool) -> tuple[Tensor, Tensor]:
    if use_fft:
        qbar, kbar = fft_filter_time_last(z, [fq, fk])
    else:
        qbar, kbar = (c.permute(1, 2, 3, 0) for c in direct_filter(z, [fq, fk]))
    return _apply(xq, qbar), _apply(xk, kbar)


def block_length(target: int, kernel_size: int) -> int:
    """The number of positions l ≥ max(target, P) of a block whose noise span l + P − 1 is
    5-smooth, so that its FFT needs no zero padding (:func:`spe.ops.conv.filters.fft_size`)."""
    return fft_size(max(target, kernel_size) + kernel_size - 1) - kernel_size + 1


class _ConvCodeProduct(torch.autograd.Function):
    """Both products, block by block; backward forms each block again and differentiates it
    alone (its inputs detached), writing the block's gradients into whole-length buffers: per
    block autograd would otherwise zero-fill a whole-length gradient for every slice."""

    @staticmethod
    def forward(ctx, queries: Tensor, keys: Tensor, z: Tensor, fq: Tensor, fk: Tensor,
                how: tuple[bool, int]) -> tuple[Tensor, Tensor]:
        use_fft, block = how  # (filter by FFT, positions per block)
        b, n, h, _ = queries.shape
        r, p = z.shape[2], fq.shape[-1]
        out_q, out_k = queries.new_empty(b, n, h, r), keys.new_empty(b, n, h, r)
        for s in range(0, n, block):
            e = min(n, s + block)
            out_q[:, s:e], out_k[:, s:e] = _block(queries[:, s:e], keys[:, s:e], z[..., s:e + p - 1], fq, fk, use_fft)
        ctx.save_for_backward(queries, keys, z, fq, fk)
        ctx.use_fft, ctx.block = use_fft, block
        return out_q, out_k

    @staticmethod
    def backward(ctx, grad_q: Tensor, grad_k: Tensor):
        queries, keys, z, fq, fk = ctx.saved_tensors
        n, p = queries.shape[1], fq.shape[-1]
        need_q, need_k, _, need_fq, need_fk = ctx.needs_input_grad[:5]
        gq = torch.empty_like(queries) if need_q else None
        gk = torch.empty_like(keys) if need_k else None
        gfq = torch.zeros_like(fq) if need_fq else None
        gfk = torch.zeros_like(fk) if need_fk else None
        for s in range(0, n, ctx.block):
            e = min(n, s + ctx.block)
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_() for t in (queries[:, s:e], keys[:, s:e], fq, fk)]
                yq, yk = _block(leaves[0], leaves[1], z[..., s:e + p - 1], leaves[2], leaves[3], ctx.use_fft)
                grads = torch.autograd.grad((yq, yk), leaves, (grad_q[:, s:e], grad_k[:, s:e]))
            if gq is not None:
                gq[:, s:e] = grads[0]
            if gk is not None:
                gk[:, s:e] = grads[1]
            if gfq is not None:
                gfq += grads[2]
            if gfk is not None:
                gfk += grads[3]
        return gq, gk, None, gfq, gfk, None


def conv_code_product(queries: Tensor, keys: Tensor, z: Tensor, filters_q: Tensor, filters_k: Tensor, *,
                      use_fft: bool = True, block_elements: int = 1 << 23) -> tuple[Tensor, Tensor]:
    """q̂ = Σ_d x_d Q̄_d and k̂ = Σ_d x_d K̄_d (eq. 16-17) with Q̄, K̄ filtered noise (eq. 22),
    never forming the whole codes.

    Args:
        queries, keys: (B, L, H, D), already scaled (and gated) by the caller.
        z: (H, D, R, L + P − 1) noise, time last: position t's code filters samples t … t + P − 1
            (:meth:`spe.ConvSPE.noise_span` of the first position − P + 1); no gradient flows to it.
        filters_q, filters_k: (H, D, P) Φ^Q, Φ^K.
        use_fft: filter each block by FFT (True) or by direct convolution.
        block_elements: the most elements of one block's code (l·H·D·R); a block holds at
            least P positions so that the P − 1 samples of overlap stay a fraction of it.

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
    block = block_length(block_elements // max(1, h * d * z.shape[2]), p)
    return _ConvCodeProduct.apply(queries, keys, z.detach(), filters_q, filters_k, (use_fft, block))

"""PaTH attention in chunks: the UT transform of products of Householder-like matrices.

Letters: B = batch, L = length, H = num_heads, D = head_dim, E = value dimension,
C = chunk length, N = number of chunks (L padded to N·C with H_t = I).

Within a chunk with rows w_t, β_t (W: C × D), the product H_last ⋯ H_first is
I − Wᵀ T diag(β) W with T = (I + diag(β) tril₋₁(W Wᵀ))⁻¹ (unit lower triangular: one
triangular solve, the UT transform of DeltaNet's WY form; Yang et al. 2025, section 3). From it,
per chunk:

* logits inside the chunk, q_mᵀ H_m ⋯ H_{n+1} k_n = q_m·k_n − [tril(Q Wᵀ) T diag(β) tril₋₁(W Kᵀ)]_mn;
* queries carried to the chunk's start, q̂_mᵀ = q_mᵀ H_m ⋯ H_first: Q̂ = Q − tril(Q Wᵀ) T diag(β) W;
* keys carried to the chunk's end, k̂_n = H_last ⋯ H_{n+1} k_n: K̂ = K − (T diag(β) tril₋₁(W Kᵀ))ᵀ W;
* the chunk's product P = I − Wᵀ T diag(β) W (D × D).

Between chunk i and an earlier chunk j the logits are q̂ᵀ P_{i−1} ⋯ P_{j+1} k̂: the loop over the
distance i − j carries every chunk's queries through one more P at a time, N − 1 batched
matmuls. Nothing of size (L, L, D, D) is formed: the D × D matrices are one per chunk, the
logits (B, H, L, L) are softmax's own. Time O(L²·D + L·C·D + L·D²), memory O(L²) per head for
the logits plus, for the backward, N copies of the queries (O(L²·D / C)).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spe.ops.softmax.chunk import gate_bias
from spe.ops.linear_attn.options import kernel_dtype
from spe.ops.path.checks import check_path_inputs
from spe.ops.path.flash import FLASH_MIN_LENGTH, flash_path_attention
from spe.ops.path.terms import chunk_terms

__all__ = ["DEFAULT_CHUNK_SIZE", "PATH_IMPLS", "path_attention", "path_logits", "path_transformed_keys"]

DEFAULT_CHUNK_SIZE = 64
# path_attention's forms: "chunk" (this module's, the (B, H, L, L) logits), "flash"
# (:mod:`~spe.ops.path.flash`, blocks recomputed in backward), "auto" (flash from
# spe.ops.path.flash.FLASH_MIN_LENGTH positions on).
PATH_IMPLS = ("auto", "chunk", "flash")


def path_logits(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, *,
                chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """q_mᵀ H_m ⋯ H_{n+1} k_n for n ≤ m, unscaled, in chunks (values above the diagonal are
    meaningless: mask them).

    Args:
        q, k, w: (B, L, H, D) in the compute dtype, w_t unit norm; beta: (B, L, H).
        chunk_size: C.

    Returns:
        (B, H, L, L).
    """
    b, n, h, _ = q.shape
    c = min(chunk_size, n)
    intra, q_hat, k_hat, product = chunk_terms(q, k, w, beta, c)
    num = intra.shape[2]
    blocks, rows, cols = [intra], [torch.arange(num)], [torch.arange(num)]
    carried = q_hat
    for lag in range(1, num):  # query chunk i with key chunk i − lag
        carried = carried[:, :, 1:]  # chunks i = lag … N − 1
        if lag > 1:  # row vectors: q̂_mᵀ P_{i−1} ⋯ P_{i−lag+1}
            carried = carried @ product[:, :, 1:num - lag + 1]
        blocks.append(carried @ k_hat[:, :, :num - lag].transpose(-1, -2))
        rows.append(torch.arange(lag, num))
        cols.append(torch.arange(num - lag))
    grid = q_hat.new_zeros(b, h, num, num, c, c)
    grid[:, :, torch.cat(rows), torch.cat(cols)] = torch.cat(blocks, 2)
    return grid.transpose(3, 4).reshape(b, h, num * c, num * c)[..., :n, :n]


def path_transformed_keys(k: Tensor, w: Tensor, beta: Tensor, *,
                          chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """The keys carried to the last position, k̃_n = H_{L−1} ⋯ H_{n+1} k_n (a KV cache after a
    prompt of L positions: the next query needs only H_L applied to them).

    Args:
        k, w: (B, L, H, D), w_t unit norm; beta: (B, L, H).

    Returns:
        (B, L, H, D).
    """
    b, n, h, d = k.shape
    c = min(chunk_size, n)
    _, _, k_hat, product = chunk_terms(None, k, w, beta, c)
    out = [k_hat[:, :, -1]]
    suffix = torch.eye(d, dtype=k.dtype, device=k.device).expand(b, h, d, d)  # P_{N−1} ⋯ P_{j+1}
    for j in range(k_hat.shape[2] - 2, -1, -1):
        suffix = suffix @ product[:, :, j + 1]
        out.append(k_hat[:, :, j] @ suffix.transpose(-1, -2))
    return torch.stack(out[::-1], 2).flatten(2, 3)[:, :, :n].transpose(1, 2)


def path_attention(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, *,
                   log_decay: Tensor | None = None, scale: float | None = None,
                   chunk_size: int = DEFAULT_CHUNK_SIZE, impl: str = "auto") -> Tensor:
    """Causal PaTH attention (Yang et al. 2025): y_m = Σ_{n≤m} softmax_n(s_mn) v_n with
    s_mn = scale · q_mᵀ (H_m ⋯ H_{n+1}) k_n + F_m − F_n, H_t = I − β_t w_t w_tᵀ, F the running
    sum of the gate (PaTH-FoX; none without one).

    The product is the one fla's ``naive_path_attn`` applies (the H of every token after the
    key, up to and including the query's). Unlike fla, the gate is not multiplied by ``scale``
    (FoX's logits, Lin et al. 2025, and :func:`~spe.ops.softmax.softmax_attention`'s): fla's
    gate g equals ours times 1/scale.

    Args:
        q, k: (B, L, H, D) queries and keys.
        v: (B, L, H, E) values.
        w: (B, L, H, D) directions of unit norm (required, not normalised here: ValueError
            beyond |‖w_t‖ − 1| > max(1e-3, 8 ulps); a row of norm ≈ 0, as F.normalize leaves
            a zero row, is taken too: H_t ≈ I).
        beta: (B, L, H) β_t in [0, 2] (2·sigmoid(·) in PaTH; 0: H_t = I, plain softmax; 2: a
            reflection).
        log_decay: (B, L, H) FoX's forget gate G_t ≤ 0 (log of a factor in (0, 1]), or None.
        scale: multiplies q·k; None: 1/√D.
        chunk_size: C of the chunked form (results do not depend on it beyond rounding).
        impl: ``"chunk"`` forms the (B, H, L, L) logits and keeps them and every chunk's carried
            queries for backward (O(L²) memory; the faster below ~1,000 positions on a CPU);
            ``"flash"`` (:func:`~spe.ops.path.flash.flash_path_attention`) goes block by block
            with an online softmax and recomputes each block in backward (O(L·D) kept);
            ``"auto"``: flash from :data:`~spe.ops.path.flash.FLASH_MIN_LENGTH` positions on.
            The same function either way, to rounding.

    Returns:
        (B, L, H, E) in ``v``'s dtype; computed in the widest of q's, k's and float32, autocast off.

    Raises:
        ValueError: naming a shape, dtype or value received that is not allowed (w not unit,
            beta outside [0, 2], a gate > 0 or of another shape, a scale ≤ 0, an unknown impl).
    """

    gates, scale = check_path_inputs(q, k, v, w, beta, log_decay=log_decay, scale=scale)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if impl not in PATH_IMPLS:
        raise ValueError(f"impl must be one of {', '.join(PATH_IMPLS)}, got {impl!r}")
    dtype = kernel_dtype(q, k)
    with torch.autocast(q.device.type, enabled=False):
        q, k, w, beta = (t.to(dtype) for t in (q, k, w, beta))
        if q.shape[1] and (impl == "flash" or impl == "auto" and q.shape[1] >= FLASH_MIN_LENGTH):
            gates = None if gates is None else gates.to(dtype)
            return flash_path_attention(q, k, v.to(dtype), w, beta, gates, scale=scale,
                                        chunk_size=chunk_size).to(v.dtype)
        scores = path_logits(q, k, w, beta, chunk_size=chunk_size) * scale
        if gates is not None:
            scores = scores + gate_bias(gates.to(dtype))  # −∞ after m
        else:
            future = torch.ones(q.shape[1], q.shape[1], dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(future, -math.inf)
        y = torch.einsum("bhmn,bnhe->bmhe", scores.softmax(-1), v.to(dtype))
    return y.to(v.dtype)

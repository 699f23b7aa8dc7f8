"""PaTH attention flash-style: blocks of queries against tiles of earlier keys, nothing L × L formed.

Letters: B = batch, L = length, H = num_heads, D = head_dim, E = value dimension, C = chunk
length (the UT transform's, :mod:`~spe.ops.path.chunk`), N = number of chunks, R = queries per
block (whole chunks), T = keys per tile (whole chunks).

From the chunk terms of :mod:`~spe.ops.path.chunk` (intra-chunk logits, queries carried to their
chunk's start q̂, keys carried to their chunk's end k̂, chunk products P_j = H_last ⋯ H_first), one
block of queries, chunks c₀ … c₁ − 1, forms its logits in two parts:

* inside the block (R × R), chunk by chunk: the query row vectors r = q̂_i P_{i−1} ⋯ P_{j+1}
  against k̂_j, ending at the queries carried to the block's start, q̃ = q̂_i P_{i−1} ⋯ P_{c₀};
* before the block, tile by tile: every earlier key carried to the block's start,
  k̃_j = k̂_j A_jᵀ with A_j = P_{c₀−1} ⋯ P_{j+1} (A_{c₀−1} = I, A_{j−1} = A_j P_j: one D × D
  product per earlier chunk), the logits q̃ k̃ᵀ of one tile at a time.

The scale, FoX's bias (Σ_{n<t≤m} G_t, each entry a sum of its own gates: inside the block
:func:`~spe.ops.softmax.chunk.gate_bias`, before it the gates from the block's start to the query
plus those from the key to the block's start) or the causal mask, and an online softmax over the
tiles (FlashAttention's running maximum and sum) give the outputs and each query's log-sum-exp.

Forward forms each chunk's terms once, in the block of its queries; its k̂ and P serve the later
blocks and are kept for backward.

Backward (FlashAttention-2's, per block, the last block first): the block's own chunk terms formed
again from its positions, with autograd; the products A_j again, then per tile the carried keys,
the logits, the weights exp(s − lse), dV += Pᵀ dY, dS = P ∘ (dY Vᵀ − Δ) with Δ = rowsum(dY ∘ Y),
the gradients of q̃ and of the carried keys, back through k̃_j = k̂_j A_jᵀ, and after the tiles
through the chain of A_j (one D × D product per chunk, in the opposite order). A block adds to the
k̂ and P gradients of earlier chunks only, so by the time a block is reached its own chunks' are
whole, and one gradient through its terms (one scalar's) takes its R × R part, q̃, k̂ and P
together. The chunk terms (their triangular solves) are thus formed twice a step, not recomputed
per use: they are the form's fixed cost per position, which weighs most at short L.

Memory: kept for backward the inputs, the outputs, the log-sum-exp and every chunk's k̂ and P,
O(L·D + N·D²). Held at a time: their gradients (O(L·D + N·D²)), the block's A_j and their
gradients (O(N·D²)), one tile's R × T logits and weights. Never L × L. Softmax weights below
e^−80 are taken as e^−80 (:data:`_EXP_FLOOR`). Time O(L²·D) for the logits and values (as
softmax's), plus O(L²·D²/R) to carry the earlier keys to each block's start and O(L²·D³/(R·C))
for the products A_j; about L²/(R·C) Python steps for the products and L²/(R·T) for the tiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from spe.ops.decay.sums import suffix_sums
from spe.ops.path.terms import chunk_blocks, chunk_terms
from spe.ops.softmax.chunk import gate_bias

__all__ = ["FLASH_BLOCK", "FLASH_MIN_LENGTH", "FLASH_TILE", "flash_path_attention"]

# From this many positions on, path_attention(impl="auto") takes this form: one causal layer
# (B = 1, H = 4, D = 64, float32, one thread of the development CPU) forward + backward took
# about as long both ways at 1,024 positions (PaTH-FoX less here), less memory here from there on,
# and at 512 the chunked form was faster (fewer Python steps).
FLASH_MIN_LENGTH = 1024

# Queries per block and keys per tile (rounded down to whole chunks, at least one): one tile's
# logits and weights are R × T; more queries per block means fewer carries of the earlier keys
# (O(L²·D²/R)), more keys per tile fewer Python steps.
FLASH_BLOCK = 128
FLASH_TILE = 512
# Softmax weights below e^-80 (~2e-35, the smallest normal float32 is ~1e-38) are taken as e^-80:
# exp is ~20× slower on the CPU where it underflows, which FoX's gates do for most of a long row.
_EXP_FLOOR = -80.0


def _inner(intra: Tensor, q_hat: Tensor, k_hat: Tensor, product: Tensor, gates: Tensor | None,
           scale: float) -> tuple[Tensor, Tensor]:
    """One block's own logits and its queries carried to its start.

    Args:
        intra: (B, H, g, C, C); q_hat, k_hat: (B, H, g, C, D); product: (B, H, g, D, D): the
            block's g chunks' terms. gates: (B, H, g·C) or None.
        scale: multiplies q·k.

    Returns:
        (scores (B, H, g·C, g·C), scaled, with the gate's bias and −∞ after each query;
        q̃ (B, H, g·C, D) the queries carried to the block's first position).
    """
    g, c = intra.shape[2], intra.shape[-1]
    zero = intra.new_zeros(intra.shape[:2] + (c, c))
    keys, mats = k_hat.unbind(2), product.unbind(2)
    rows, carried = [], []
    for a, (r, own) in enumerate(zip(q_hat.unbind(2), intra.unbind(2))):
        row = [zero] * g
        row[a] = own
        for j in range(a - 1, -1, -1):  # r = q̂_a P_{a−1} ⋯ P_{j+1}
            row[j] = r @ keys[j].mT
            r = r @ mats[j]
        rows.append(torch.cat(row, -1))
        carried.append(r)
    scores = torch.cat(rows, -2) * scale
    if gates is not None:
        scores = scores + gate_bias(gates.transpose(1, 2))
    else:
        future = torch.ones(g * c, g * c, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(future, -math.inf)
    return scores, torch.cat(carried, -2)


def _weights(x: Tensor) -> Tensor:
    """exp(x) in place of x (a temporary), x floored at :data:`_EXP_FLOOR`."""
    return x.clamp_(min=_EXP_FLOOR).exp_()


def _carriers(product: Tensor) -> Tensor:
    """A_j = P_{c−1} ⋯ P_{j+1} for j = 0 … c − 1 (A_{c−1} = I) from product (B, H, c, D, D)."""
    mats = product.unbind(2)
    out = [torch.eye(product.shape[-1], dtype=product.dtype, device=product.device).expand_as(mats[0])]
    for j in range(len(mats) - 1, 0, -1):
        out.append(out[-1] @ mats[j])
    return torch.stack(out[::-1], 2)


def _tiles(num: int, size: int):
    return [(s, min(num, s + size)) for s in range(0, num, size)]


@dataclass(frozen=True)
class _Sizes:
    """The scalars of one call: the logits' scale, C positions a chunk, chunks a block of queries
    and chunks a tile of carried keys."""

    scale: float
    chunk: int
    block: int
    tile: int


class _FlashPath(torch.autograd.Function):
    """y (B, L, H, E) from q, k, w (B, L, H, D), v (B, L, H, E), beta and gates (B, L, H) or
    None, all in the compute dtype. Saves the inputs, y and the log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, w, beta, gates, sizes: _Sizes):
        scale, chunk, block, tile = sizes.scale, sizes.chunk, sizes.block, sizes.tile
        n, c = q.shape[1], chunk
        num, (b, _, h, d) = -(-n // c), q.shape
        # every chunk's k̂ and P, filled block by block from the terms each block forms for its own
        # queries (the blocks before it have filled those its cross part reads), kept for backward
        k_hat, product = q.new_empty(b, h, num, c, d), q.new_empty(b, h, num, d, d)
        v_b, g_b = chunk_blocks(v, c).flatten(2, 3), _gate_rows(gates, c)
        outs, lses = [], []
        for c0, c1 in _tiles(num, block):
            lo, hi = c0 * c, c1 * c
            span = slice(lo, min(n, hi))
            terms = chunk_terms(q[:, span], k[:, span], w[:, span], beta[:, span], c)
            k_hat[:, :, c0:c1], product[:, :, c0:c1] = terms[2], terms[3]
            s, q_t = _inner(*terms, None if g_b is None else g_b[:, :, lo:hi], scale)
            top = s.amax(-1)
            p = _weights(s - top[..., None]).masked_fill_(s.isneginf(), 0)
            total, acc = p.sum(-1), p @ v_b[:, :, lo:hi]
            if c0:
                keys = (k_hat[:, :, :c0] @ _carriers(product[:, :, :c0]).mT).flatten(2, 3)  # (B, H, lo, D)
                within, before = _cross_gates(g_b, lo, hi)
                q_t = q_t * scale
                for k0, k1 in _tiles(lo, tile * c):
                    s = _cross_scores(q_t, keys[:, :, k0:k1], within, before, k0, k1)
                    new_top = torch.maximum(top, s.amax(-1))
                    fade = torch.exp(top - new_top)
                    p = _weights(s.sub_(new_top[..., None]))
                    total = total.mul_(fade).add_(p.sum(-1))
                    acc = acc.mul_(fade[..., None]).add_(p @ v_b[:, :, k0:k1])
                    top = new_top
            outs.append(acc / total[..., None])
            lses.append(top + total.log())
        y, lse = torch.cat(outs, 2), torch.cat(lses, 2)
        ctx.save_for_backward(q, k, v, w, beta, gates, y, lse, k_hat, product)
        ctx.scale, ctx.chunk, ctx.block, ctx.tile = scale, chunk, block, tile
        return y[:, :, :n].transpose(1, 2)

    @staticmethod
    def backward(ctx, dy):
        q, k, v, w, beta, gates, y, lse, k_hat, product = ctx.saved_tensors
        c, scale, n = ctx.chunk, ctx.scale, q.shape[1]
        v_b, g_b, dy_b = chunk_blocks(v, c).flatten(2, 3), _gate_rows(gates, c), chunk_blocks(dy, c).flatten(2, 3)
        delta = (dy_b * y).sum(-1)  # Δ (B, H, N·C)
        d_k_hat, d_product, d_v = (torch.zeros_like(t) for t in (k_hat, product, v_b))
        d_inputs = [torch.zeros_like(t) for t in (q, k, w, beta)]
        d_g = None if g_b is None else torch.zeros_like(g_b)
        # last block first: a block's cross part adds to the k̂ and P gradients of earlier chunks
        # only, so when a block is reached its own chunks' are whole, and one gradient through its
        # terms serves its logits, its carried queries and its keys' k̂ and P
        for c0, c1 in reversed(_tiles(k_hat.shape[2], ctx.block)):
            lo, hi = c0 * c, c1 * c
            span = slice(lo, min(n, hi))
            leaves = [t[:, span].detach().requires_grad_() for t in (q, k, w, beta)]
            own_gates = None if g_b is None else g_b[:, :, lo:hi].detach().requires_grad_()
            with torch.enable_grad():
                terms = chunk_terms(*leaves, c)
                s, q_t = _inner(*terms, own_gates, scale)
            rows_lse, rows_delta, rows_dy = lse[:, :, lo:hi], delta[:, :, lo:hi], dy_b[:, :, lo:hi]
            p = _weights(s.detach() - rows_lse[..., None]).masked_fill_(s.detach().isneginf(), 0)
            d_v[:, :, lo:hi] += p.mT @ rows_dy
            d_s = p * (rows_dy @ v_b[:, :, lo:hi].mT - rows_delta[..., None])
            d_q_t = torch.zeros_like(q_t)
            if c0:
                carriers = _carriers(product[:, :, :c0])
                d_carriers = torch.empty_like(carriers)
                within, before = _cross_gates(g_b, lo, hi)
                d_within = None if g_b is None else torch.zeros_like(within)
                d_before = None if g_b is None else torch.zeros_like(before)
                q_t_plain = q_t.detach()
                q_scaled = q_t_plain * scale
                for j0, j1 in _tiles(c0, ctx.tile):  # keys carried a tile at a time: O(T·D) held, not O(L·D)
                    k0, k1, a, kh = j0 * c, j1 * c, carriers[:, :, j0:j1], k_hat[:, :, j0:j1]
                    keys = (kh @ a.mT).flatten(2, 3)
                    x = _cross_scores(q_scaled, keys, within, before, k0, k1)
                    pc = _weights(x.sub_(rows_lse[..., None]))
                    d_v[:, :, k0:k1] += pc.mT @ rows_dy
                    d_x = (rows_dy @ v_b[:, :, k0:k1].mT).sub_(rows_delta[..., None]).mul_(pc)
                    if d_within is not None:
                        d_within += d_x.sum(-1)
                        d_before[:, :, k0:k1] += d_x.sum(-2)
                    d_x.mul_(scale)
                    d_q_t += d_x @ keys
                    d_keys = (d_x.mT @ q_t_plain).unflatten(2, (j1 - j0, c))  # (B, H, t, C, D)
                    d_k_hat[:, :, j0:j1] += d_keys @ a
                    d_carriers[:, :, j0:j1] = d_keys.mT @ kh
                _chain_backward(carriers, d_carriers, product[:, :, :c0], d_product[:, :, :c0])
                if d_g is not None:
                    d_g[:, :, lo:hi] += d_within.flip(-1).cumsum(-1).flip(-1)  # G_t enters every row m ≥ t
                    d_g[:, :, 1:lo] += d_before[:, :, :-1].cumsum(-1)  # and every key n < t before the block
            grads = _vjp((s, q_t, terms[2], terms[3]), leaves + ([] if own_gates is None else [own_gates]),
                         (d_s, d_q_t, d_k_hat[:, :, c0:c1], d_product[:, :, c0:c1]))
            for total, grad in zip(d_inputs, grads):
                if grad is not None:
                    total[:, span] += grad
            if own_gates is not None:
                d_g[:, :, lo:hi] += grads[4]
        d_v = d_v[:, :, :n].transpose(1, 2)
        d_gates = None if d_g is None else d_g[:, :, :n].transpose(1, 2)
        return (*d_inputs[:2], d_v, *d_inputs[2:], d_gates, None)


def _chain_backward(carriers: Tensor, d_carriers: Tensor, product: Tensor, d_product: Tensor) -> None:
    """Adds to d_product (B, H, c, D, D) the gradient through the products A_j = ``carriers`` of
    :func:`_carriers` (A_{c−1} = I, A_{j−1} = A_j P_j) given each A_j's own gradient d_carriers
    (B, H, c, D, D); in place."""
    mats, count = product.unbind(2), product.shape[2]
    total = d_carriers[:, :, 0]  # Ā_j: A_j's whole gradient, from A_{j−1} = A_j P_j downwards
    for j in range(1, count):
        d_product[:, :, j] += carriers[:, :, j].mT @ total
        if j < count - 1:
            total = d_carriers[:, :, j] + total @ mats[j].mT


def _vjp(outputs, inputs, grads):
    """torch.autograd.grad(outputs, inputs, grads) as the gradient of Σ outputs·grads, a scalar: the same
    numbers, without the shape checks of explicit output gradients (which import sympy, ~35 MB of
    resident memory the first time)."""
    with torch.enable_grad():
        total = sum((out * grad).sum() for out, grad in zip(outputs, grads))
    return torch.autograd.grad(total, inputs, allow_unused=True)


def _gate_rows(gates: Tensor | None, c: int) -> Tensor | None:
    """(B, L, H) → (B, H, N·C), zero-padded (a gate of 0 decays nothing)."""
    return None if gates is None else F.pad(gates.transpose(1, 2), (0, (-gates.shape[1]) % c))


def _cross_gates(gates: Tensor | None, lo: int, hi: int) -> tuple[Tensor | None, Tensor | None]:
    """For queries lo … hi − 1 and keys before lo: Σ_{lo≤t≤m} G_t (B, H, hi − lo) and Σ_{n<t<lo} G_t
    (B, H, lo), each a sum of terms ≤ 0; None without a gate."""
    if gates is None:
        return None, None
    return gates[:, :, lo:hi].cumsum(-1), suffix_sums(gates[:, :, :lo], -1)


def _cross_scores(q_scaled: Tensor, keys: Tensor, within: Tensor | None, before: Tensor | None, k0: int,
                  k1: int) -> Tensor:
    """Logits (B, H, R, k1 − k0) of the block's carried queries (already scaled) against carried keys
    k0 … k1 − 1 (B, H, k1 − k0, D), with FoX's bias."""
    s = q_scaled @ keys.mT
    if within is not None:
        s.add_(within[..., :, None]).add_(before[..., None, k0:k1])
    return s


def flash_path_attention(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, gates: Tensor | None, *,
                         scale: float, chunk_size: int, block: int = FLASH_BLOCK, tile: int = FLASH_TILE) -> Tensor:
    """Causal PaTH attention block by block (the module docstring), inputs already checked and in
    the compute dtype: q, k, w (B, L, H, D), v (B, L, H, E), beta and gates (B, L, H) (gates None
    without FoX), ``scale`` a float. Chunks of C = min(chunk_size, L) positions; blocks of
    max(1, block // C) chunks of queries, tiles of max(1, tile // C) chunks of keys. Returns
    (B, L, H, E) in the compute dtype."""
    c = min(chunk_size, q.shape[1])
    return _FlashPath.apply(q, k, v, w, beta, gates, _Sizes(scale, c, max(1, block // c), max(1, tile // c)))

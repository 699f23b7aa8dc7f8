"""Chunked causal sums of linear attention, unnormalised: the algorithms behind
:func:`spe.ops.linear_attn.chunk.causal_linear_attention`.

Letters: B = batch, L = length, H = num_heads, M = feature dimension of φ, E = value
dimension (with the normaliser's column of ones, if any), C = chunk, N = chunks, W = window.

    out_m = Σ_{n ≤ m} φ(q_m)ᵀ φ(k_n) values_n     (Σ over m − W < n ≤ m with a window)

Inside a chunk: the masked C × C product; across chunks: a carried state (whole past) or sums
of the whole chunks inside the window by doubling (never a difference of prefix sums). Keys
with log scales go to :mod:`spe.ops.common.scaled`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from spe.ops.common.scaled import scaled_causal_sums, scaled_window_sums

__all__ = ["causal_sums"]


def causal_sums(phi_q: Tensor, phi_k: Tensor, values: Tensor, chunk_size: int, group_size: int | None, *,
                state: Tensor | None = None, window: int | None = None, scale: Tensor | None = None,
                state_scale: Tensor | None = None,
                log_decay: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Unnormalised Σ_{n ≤ m} φ(q_m)ᵀφ(k_n) values_n, chunked; (B, L, H, E), the final
    state Σ_n φ(k_n) values_nᵀ (B, H, M, E) (added to ``state``, the sum of earlier keys) and
    its scale (None without ``scale``, the running maximum of :mod:`spe.ops.common.scaled`).

    With a window (W < L), Σ over m − W < n ≤ m instead, and no state. With ``log_decay``
    (H,) λ = log γ, each term is weighed by γ^{m−n} (:mod:`spe.ops.decay`); it needs ``scale``
    (zeros for keys without log scales), the decayed running maximum.
    """
    if log_decay is not None and scale is None:
        raise ValueError("causal_sums: a decay runs through the scaled sums; pass scale (zeros without key scales)")
    if window is not None:
        if scale is not None:
            return scaled_window_sums(phi_q, phi_k, values, scale, chunk_size, window, log_decay=log_decay), None, None
        return _window_sums(phi_q, phi_k, values, chunk_size, window), None, None
    if scale is not None:
        return scaled_causal_sums(phi_q, phi_k, values, scale, chunk_size, state=state, state_scale=state_scale,
                                  log_decay=log_decay)
    return _plain_causal_sums(phi_q, phi_k, values, chunk_size, group_size, state)


def _plain_causal_sums(phi_q: Tensor, phi_k: Tensor, values: Tensor, chunk_size: int, group_size: int | None,
                       state: Tensor | None) -> tuple[Tensor, Tensor, None]:
    """The whole-past case of :func:`causal_sums` without scales: chunks ``group_size`` positions
    at a time (all at once by default), the state carried from group to group."""
    b, n, h, m = phi_q.shape
    c = max(1, min(chunk_size, n))
    pad = (-n) % c
    if pad:  # zero keys add nothing to any state; padded queries are dropped below
        phi_q, phi_k, values = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (phi_q, phi_k, values))
    e1 = values.shape[-1]
    step = n + pad if group_size is None else max(1, group_size // c) * c
    mask = torch.ones(c, c, dtype=torch.bool, device=values.device).tril()
    state = phi_q.new_zeros(b, 1, h, m, e1) if state is None else state[:, None].to(phi_q.dtype)
    outs = []
    for start in range(0, n + pad, step):
        stop = min(n + pad, start + step)
        nc = (stop - start) // c
        q = phi_q[:, start:stop].reshape(b, nc, c, h, m)
        k = phi_k[:, start:stop].reshape(b, nc, c, h, m)
        vv = values[:, start:stop].reshape(b, nc, c, h, e1)
        kv = torch.einsum("bnchm,bnche->bnhme", k, vv)  # (B, N, H, M, E) per-chunk sums
        cum = torch.cumsum(kv, dim=1)
        before = torch.cat([state, state + cum[:, :-1]], dim=1)  # exclusive prefix + carried state
        out = torch.einsum("bnchm,bnhme->bnche", q, before)
        scores = torch.einsum("bnchm,bndhm->bnhcd", q, k).masked_fill(~mask, 0.0)
        out = out + torch.einsum("bnhcd,bndhe->bnche", scores, vv)
        outs.append(out.reshape(b, nc * c, h, e1))
        state = state + cum[:, -1:]
    return torch.cat(outs, dim=1)[:, :n], state[:, 0], None


def _chunk_window_sums(kv: Tensor, whole: int) -> Tensor:
    """between[:, i] = Σ_{i − whole ≤ j < i} kv[:, j] (the whole chunks before chunk i), by doubling.

    Blocks of 2^p chunks are built as sums of two blocks of 2^(p−1) and added for each set bit
    of ``whole``: every output is a plain sum of the in-window chunk states, so rounding is
    relative to the window's own terms (a difference of prefix sums would carry residues of
    every earlier key: docs/numerics.md). O(N log whole) work, three (N + whole) arrays.
    """
    nc = kv.shape[1]
    block = torch.cat([torch.zeros_like(kv[:, :whole]), kv], dim=1)  # chunk j at index j + whole
    between, covered, size = torch.zeros_like(kv), 0, 1
    while size <= whole:
        if whole & size:
            covered += size  # adds chunks i − covered … i − covered + size − 1
            between = between + block[:, whole - covered:whole - covered + nc]
        if 2 * size <= whole:
            block = block[:, :-size] + block[:, size:]  # block[j] = Σ of 2·size chunks from j
        size *= 2
    return between


def _window_sums(phi_q: Tensor, phi_k: Tensor, values: Tensor, chunk_size: int, window: int) -> Tensor:
    """Σ_{m − W < n ≤ m} φ(q_m)ᵀφ(k_n) values_n for W < L; (B, L, H, E).

    A query at offset j of chunk i and a key at offset d of chunk i − k are k·C + j − d
    positions apart. Chunk i − k is wholly inside the window when that lag is < W for every
    j, d (k ≥ 1); the chunks it cuts (k = 0, and at most two more) get a masked product.
    """
    b, n, h, m = phi_q.shape
    c = min(chunk_size, n)
    pad = (-n) % c
    if pad:
        phi_q, phi_k, values = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (phi_q, phi_k, values))
    nc, e1 = (n + pad) // c, values.shape[-1]
    q = phi_q.reshape(b, nc, c, h, m)
    k = phi_k.reshape(b, nc, c, h, m)
    vv = values.reshape(b, nc, c, h, e1)
    offsets = torch.arange(c, device=values.device)
    lag0 = offsets[:, None] - offsets[None, :]  # j − d
    whole, cut = 0, []
    for shift in range((window + c - 1) // c + 1):
        mask = (shift * c + lag0 >= 0) & (shift * c + lag0 < window)
        if shift >= 1 and bool(mask.all()):
            whole = shift  # whole chunks are shifts 1 … whole, contiguous
        elif bool(mask.any()) and shift < nc:
            cut.append((shift, mask))
    out = torch.zeros(b, nc, c, h, e1, dtype=values.dtype, device=values.device)
    if whole:
        kv = torch.einsum("bnchm,bnche->bnhme", k, vv)
        out = out + torch.einsum("bnchm,bnhme->bnche", q, _chunk_window_sums(kv, min(whole, nc)))
    for shift, mask in cut:
        scores = torch.einsum("bnchm,bndhm->bnhcd", q[:, shift:], k[:, :nc - shift]).masked_fill(~mask, 0.0)
        part = torch.einsum("bnhcd,bndhe->bnche", scores, vv[:, :nc - shift])
        out = torch.cat([out[:, :shift], out[:, shift:] + part], dim=1) if shift else out + part
    return out.reshape(b, nc * c, h, e1)[:, :n]

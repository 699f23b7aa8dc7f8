"""Block-local softmax attention: the Music Transformer's local attention (Huang et al. 2018, section
3.5, after Liu et al. 2018).

Letters: B = batch, L = length, H = num_heads, E = query/key dimension, Ev = value dimension,
N = block length (``block``), nb = ⌈L / N⌉ blocks.

The sequence is cut into non-overlapping blocks of N positions; a query of block b attends to the
keys of its own block (causally in a decoder) and of the whole previous block b − 1: key n is seen
from query m iff ⌊m/N⌋ − ⌊n/N⌋ ∈ {0, 1} (and n ≤ m when causal). The first block has no previous
block; a last block of fewer than N positions (a ragged length) is padded and its padding masked.

The blocks are batched: queries (B·nb, N), keys and values (B·nb, 2N), the previous block's then
the block's own, so query i of a block sits at window position N + i and its relative distances
to the keys it sees lie in [−(2N − 1), 0] (causal) or [−(2N − 1), N − 1]. Memory O(B·H·L·N) for the
scores, never L × L; time O(L·N·E). Decoding keeps at most 2N keys (:func:`block_local_step`).
A score term (Shaw's, the Music Transformer's, a distance bias, the SPE oracle) sees each window
as keys at positions 0 … 2N − 1 and its queries from offset N: exact for terms of the distance
j − i alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from spe.ops.common.checks import check_one_position, check_window
from spe.ops.common.state import KVCache
from spe.ops.softmax.checks import check_key_padding_mask
from spe.ops.softmax.chunk import attend

__all__ = ["BlockAttend", "block_cache", "block_keep", "block_local_attention", "block_local_step",
           "check_blocks", "prefill_block_cache", "relative_block_attention", "skew_queries_last"]

# A score term's attention over a batch of windows: queries (N', Nq, H, E) at window positions
# query_offset …, keys (N', Nk, H, E) and values (N', Nk, H, Ev) at 0 … Nk − 1, a (N', Nk) bool
# padding mask (True: no weight), the query offset -> (N', Nq, H, Ev).
BlockAttend = Callable[..., Tensor]


def check_blocks(block: int | None, name: str = "attention_blocks") -> None:
    """Raises ValueError naming ``name`` unless ``block`` is None or a positive int (bools refused)."""
    check_window(block, name)


def block_keep(queries: int, keys: int, block: int, *, causal: bool, device=None) -> Tensor:
    """(Lq, Lk) bool, True where key n is seen from query m: ⌊m/N⌋ − ⌊n/N⌋ ∈ {0, 1}, n ≤ m when
    causal (the L × L mask of the references and of explicit attention weights)."""
    m = torch.arange(queries, device=device)[:, None]
    n = torch.arange(keys, device=device)[None, :]
    apart = torch.div(m, block, rounding_mode="floor") - torch.div(n, block, rounding_mode="floor")
    keep = (apart == 0) | (apart == 1)
    return keep & (n <= m) if causal else keep


def _windows(x: Tensor, block: int, blocks: int) -> Tensor:
    """(B, (nb + 1)·N, …), the first N positions the previous block of block 0 -> (B·nb, 2N, …):
    each block's window, the previous block then its own."""
    b, rest = x.shape[0], x.shape[2:]
    previous = x[:, :-block].reshape(b, blocks, block, *rest)
    own = x[:, block:].reshape(b, blocks, block, *rest)
    return torch.cat([previous, own], dim=2).reshape(b * blocks, 2 * block, *rest)


def block_local_attention(q: Tensor, k: Tensor, v: Tensor, block: int, *, causal: bool,
                          key_padding_mask: Tensor | None = None, attend_term: BlockAttend | None = None) -> Tensor:
    """Block-local softmax attention, blocks batched (module docstring).

    Args:
        q: (B, L, H, E) queries; k: (B, L, H, E) keys; v: (B, L, H, Ev) values.
        block: N, positions per block.
        causal: a query sees the keys of its own block up to itself only.
        key_padding_mask: (B, L) bool, True at padding keys (no weight); non-causal only. A query
            whose window holds no real key (padding) attends to its whole window: its output is
            meaningless, as any padded position's, but finite.
        attend_term: a score term's attention over the windows (:data:`BlockAttend`), called as
            ``attend_term(q, k, v, key_padding_mask=..., query_offset=N)``; None: plain softmax.

    Returns:
        (B, L, H, Ev) in ``v``'s dtype.

    Raises:
        ValueError: on a bad ``block``, keys of another length than the queries, or a padding
            mask with ``causal`` or of the wrong shape.
    """
    check_blocks(block)
    b, n = q.shape[:2]
    if k.shape[1] != n or v.shape[1] != n:
        raise ValueError(f"block-local attention needs as many keys and values as queries, got {n} queries, "
                         f"{k.shape[1]} keys and {v.shape[1]} values")
    if key_padding_mask is not None:
        if causal:
            raise ValueError("key_padding_mask is for non-causal attention (a causal model has no padding before "
                             "its last real token)")
        check_key_padding_mask(key_padding_mask, k)
    blocks = -(-n // block)
    tail = blocks * block - n
    qb = F.pad(q, (0, 0, 0, 0, 0, tail)).reshape(b * blocks, block, *q.shape[2:])
    kw = _windows(F.pad(k, (0, 0, 0, 0, block, tail)), block, blocks)
    vw = _windows(F.pad(v, (0, 0, 0, 0, block, tail)), block, blocks)
    real = torch.zeros(b, (blocks + 1) * block, dtype=torch.bool, device=q.device)
    real[:, block:block + n] = True if key_padding_mask is None else ~key_padding_mask
    real = _windows(real, block, blocks)  # (B·nb, 2N)
    if attend_term is not None:
        # a window without a real key (an encoder's padding) attends to all of it: finite, never read
        padding = ~(real | ~real.any(dim=-1, keepdim=True))
        out = attend_term(qb, kw, vw, key_padding_mask=padding, query_offset=block)
    else:
        allowed = real[:, None, None, :]  # (B·nb, 1, 1, 2N)
        if causal:
            i = torch.arange(block, device=q.device)[:, None] + block
            allowed = allowed & (torch.arange(2 * block, device=q.device)[None, :] <= i)
        allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
        out = attend(qb, kw, vw, allowed)
    return out.reshape(b, blocks * block, *out.shape[2:])[:, :n]


def block_cache(cache: KVCache | None, k: Tensor, v: Tensor, block: int) -> KVCache:
    """The decoding cache with one more position's key (B, 1, H, E) and value (B, 1, H, Ev): the keys
    of position t = ``cache.position`` and of every earlier position from the start of the
    previous block, max(0, (⌊t/N⌋ − 1)·N), at most 2N; older keys are dropped.

    Raises:
        ValueError: on more than one position or a bad ``block``.
    """
    check_blocks(block)
    check_one_position(k=k, v=v)
    if cache is None:
        return KVCache(keys=k, values=v, position=1)
    t = cache.position
    keep = t - max(0, (t // block - 1) * block) + 1
    keys = torch.cat([cache.keys, k], dim=1)[:, -keep:]
    values = torch.cat([cache.values, v], dim=1)[:, -keep:]
    return KVCache(keys=keys, values=values, position=t + 1)


def prefill_block_cache(k: Tensor, v: Tensor, block: int) -> KVCache:
    """The cache :func:`block_cache` holds after the L positions of keys (B, L, H, E) and values
    (B, L, H, Ev): those from the start of the previous block of position L − 1."""
    check_blocks(block)
    n = k.shape[1]
    start = max(0, ((n - 1) // block - 1) * block)
    return KVCache(keys=k[:, start:], values=v[:, start:], position=n)


def block_local_step(q: Tensor, k: Tensor, v: Tensor, cache: KVCache | None, block: int, *,
                     attend_term: BlockAttend | None = None) -> tuple[Tensor, KVCache]:
    """One causal decoding step of :func:`block_local_attention`: the query (B, 1, H, E) at position
    t attends to the cached keys (:func:`block_cache`: its block up to t and the previous block).

    Args:
        q, k: (B, 1, H, E) the new position's query and key; v: (B, 1, H, Ev) its value.
        cache: the previous step's (or :func:`prefill_block_cache`'s), None at position 0.
        block: N.
        attend_term: as :func:`block_local_attention`'s, called with keys at 0 … T − 1 and
            ``query_offset`` T − 1 (T the cached keys).

    Returns:
        (B, 1, H, Ev) and the new cache (at most 2N keys).
    """
    check_one_position(q=q)
    cache = block_cache(cache, k, v, block)
    if attend_term is None:
        return attend(q, cache.keys, cache.values, None), cache
    return attend_term(q, cache.keys, cache.values, query_offset=cache.keys.shape[1] - 1), cache


def skew_queries_last(rel_logits: Tensor) -> Tensor:
    """The skewing of Huang et al. (2018) for Lq queries at the last positions of Lk keys (a window
    of block-local attention: the block's queries, the previous block's keys then its own).

    Pad a zero column on the right, flatten, drop the first Lq − 1 entries and read rows of Lk.

    Args:
        rel_logits: (..., Lq, Lk), column c holding relative distance r = c − (Lk − 1) (the product
            of each query with the embeddings of r = −(Lk − 1) … 0).

    Returns:
        (..., Lq, Lk) with out[..., i, j] = rel_logits[..., i, j − i + Lq − 1], the term of key j
        for the query at position Lk − Lq + i, for j ≤ Lk − Lq + i; entries after the query are
        meaningless (callers mask them).
    """
    *lead, lq, lk = rel_logits.shape
    if lq > lk:
        raise ValueError(f"skewing the queries last needs at most as many queries as keys, got ({lq}, {lk})")
    flat = F.pad(rel_logits, (0, 1)).reshape(*lead, lq * (lk + 1))
    return flat[..., lq - 1: lq - 1 + lq * lk].reshape(*lead, lq, lk)


def relative_block_attention(q: Tensor, k: Tensor, v: Tensor, rel_keys: Tensor, *,
                             key_padding_mask: Tensor | None = None) -> Tensor:
    """Causal Music Transformer attention of queries at the last positions of the keys, via
    :func:`skew_queries_last`: logits (q_i·k_j + q_i·e_{j−i}) / √E, O(Lq·Lk) memory beyond the
    inputs (no (Lq, Lk, E) tensor of gathered embeddings).

    Args:
        q: (B, Lq, H, E) queries at positions Lk − Lq … Lk − 1; k: (B, Lk, H, E); v: (B, Lk, H, Ev).
        rel_keys: (Lk, H, E) e_r for r = −(Lk − 1) … 0.
        key_padding_mask: (B, Lk) bool, True at padding keys (no weight).

    Returns:
        (B, Lq, H, Ev).
    """
    lq, lk, e = q.shape[1], k.shape[1], q.shape[-1]
    if rel_keys.shape != (lk, q.shape[2], e):
        raise ValueError(f"rel_keys must be ({lk}, {q.shape[2]}, {e}) for {lk} keys, got {tuple(rel_keys.shape)}")
    qh = q.transpose(1, 2)  # (B, H, Lq, E)
    bias = skew_queries_last(torch.einsum("bhie,rhe->bhir", qh, rel_keys)) * e ** -0.5
    i = torch.arange(lq, device=q.device)[:, None] + (lk - lq)
    bias = bias.masked_fill(torch.arange(lk, device=q.device)[None, :] > i, float("-inf"))
    if key_padding_mask is not None:
        bias = bias.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    return attend(q, k, v, bias)

"""Chunked causal sums of linear attention with data-dependent gates (:mod:`~spe.ops.decay.forms`),
unnormalised: the algorithm behind ``causal_linear_attention(…, log_decay=G)`` for G (B, L, H)
or (B, L, H, M).

Letters: B = batch, L = length, H = num_heads, M = feature dimension of φ, E = value
dimension, G = gate channels (1 or M), C = chunk, N = chunks, W = window.

    out_m = Σ_n φ(q_m)ᵀ diag(e^{Σ_{n<t≤m} G_t}) f_n e^{a_n − top_m} values_n,   n ≤ m (m − W < n ≤ m)

with keys f_n relative to their own log scale a_n (FAVOR+; 0 without key scales), and top_m
the largest a_n + Σ_{n<t≤m} G_t over the keys query m reaches (the decayed running maximum
c_m = max(c_{m−1} + G_m, a_m) without a window), so that every factor is ≤ 1; top is a
reference only (detached: the ratio of numerator and normaliser does not depend on it).

Inside a chunk: masked C × C products with factors e^{a_d + s_{jd} − top_j}, s the segment
sums of the gates. A channel gate over keys without log scales (the whole past; keys at the
floor scale count as zero keys, so padded and encoder calls qualify) factors its
weights as e^{F_j − top_j} · e^{−F_d} (F the gates summed from the chunk's start; rows whose
chunk's gates up to j sum below −60 nats by sub-chunks of :data:`CHANNEL_CHUNK`, exact inside
each, :func:`_factored_chunk_sums`);
otherwise its chunks are at most :data:`CHANNEL_CHUNK` long (GLA's sub-chunk) with (C, C, M)
factors. Across chunks: each chunk's keys summed to its
end, relative to their largest decayed scale; the chunks before each chunk (all of them, or
those wholly inside the window) weighed by their chunks' gates in between, never by a
difference of running sums: for a scalar gate over the whole past (up to
:data:`SCALAR_PRODUCT_CHUNKS` chunks; a channel gate up to :data:`CHANNEL_PRODUCT_CHUNKS`, its
weights per channel) one product with (N, N) chunk weights, each from its own segment sum;
otherwise (and within a window) by doubling, a block of 2^p chunks carrying the sum of its chunks'
gates, so that an earlier block decays by the sum over the blocks after it. An initial state
enters as a chunk before the first; the final state is what a chunk after the last would read.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from spe.ops.decay.forms import FLOOR_LOG_SCALE
from spe.ops.decay.sums import segment_sums, suffix_sums
from spe.ops.common.scaled import window_plan

__all__ = ["CHANNEL_CHUNK", "FACTOR_EXPONENT_LIMIT", "encoder_scalar_chunk", "gated_bidirectional_sums",
           "gated_causal_sums"]

# Longest chunk for a channel gate's exact form: its (C, C, M) factors cost B·H·L·C·M memory (16: GLA's
# sub-chunk); the factored form (keys without log scales, whole past) takes the caller's chunk.
CHANNEL_CHUNK = 16
# Most chunks (state, chunks and the empty one after) for which a scalar gate sums the chunks
# before each chunk by one (N, N) product (:func:`_chunks_before_product`); beyond, by doubling.
SCALAR_PRODUCT_CHUNKS = 512
# The same for a channel gate, whose weights are (N, N) per channel: B·H·N²·M floats, a few tensors
# of them held for backward. The product beat the doubling at 8–256 chunks (fwd + bwd, B 2, H 8,
# M 64, E 65: 0.27–0.66× its time); 128 bounds the weights (67 MB each at that shape).
CHANNEL_PRODUCT_CHUNKS = 128


def _pad_time(t: Tensor, pad: int, value: float = 0.0) -> Tensor:
    return F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad), value=value) if pad else t


def _merge_earlier(x: Tensor, rx: Tensor, y: Tensor, ry: Tensor, la_y: Tensor) -> tuple[Tensor, Tensor]:
    """x e^{rx} decayed by e^{la_y} (the gates of y's chunks) plus y e^{ry}, relative to
    r = max(rx + max la_y, ry) (so both factors are ≤ 1; −∞: an empty block).

    x, y: (B, N, H, M, E); rx, ry: (B, N, H); la_y: (B, N, H, G). Returns (sum, r), r detached.
    """
    r = torch.maximum(rx + la_y.amax(-1), ry).detach()
    ref = r.masked_fill(r == -math.inf, 0.0)  # e^{−∞ − 0} = 0, where e^{−∞ − (−∞)} would be NaN
    fx = torch.exp(rx[..., None] + la_y - ref[..., None])[..., None]  # (B, N, H, G, 1)
    return x * fx + y * torch.exp(ry - ref)[..., None, None], r


def _chunks_before(kv: Tensor, ref: Tensor, la: Tensor, whole: int) -> tuple[Tensor, Tensor]:
    """Σ_{i−whole ≤ j < i} kv_j e^{ref_j + Σ_{j<t<i} la_t} for each chunk i, by doubling, as
    (sum (B, N, H, M, E), scale (B, N, H)), relative to the end of chunk i − 1.

    kv (B, N, H, M, E) each relative to e^{ref} (B, N, H) at its chunk's end; la (B, N, H, G)
    the sum of each chunk's gates. Blocks of 2^p chunks are merged with the gates of the
    chunks after them, which each block carries (a sum of its chunks' sums).
    """
    nc = kv.shape[1]
    block = torch.cat([torch.zeros_like(kv[:, :1]).expand(-1, whole, -1, -1, -1), kv], dim=1)
    bref = torch.cat([torch.full_like(ref[:, :1], -math.inf).expand(-1, whole, -1), ref], dim=1)
    bla = torch.cat([torch.zeros_like(la[:, :1]).expand(-1, whole, -1, -1), la], dim=1)
    between, between_ref, between_la = torch.zeros_like(kv), torch.full_like(ref, -math.inf), torch.zeros_like(la)
    covered, size = 0, 1
    while size <= whole:
        if whole & size:  # the block of chunks i − covered − size … i − covered − 1
            covered += size
            lo = whole - covered
            between, between_ref = _merge_earlier(block[:, lo:lo + nc], bref[:, lo:lo + nc], between, between_ref,
                                                  between_la)
            between_la = between_la + bla[:, lo:lo + nc]
        if 2 * size <= whole:
            block, bref = _merge_earlier(block[:, :-size], bref[:, :-size], block[:, size:], bref[:, size:],
                                         bla[:, size:])
            bla = bla[:, :-size] + bla[:, size:]
        size *= 2
    return between, between_ref


def _chunks_before_product(kv: Tensor, ref: Tensor, la: Tensor, whole: int) -> tuple[Tensor, Tensor]:
    """:func:`_chunks_before` as one product with the chunk weights e^{ref_j + Σ_{j<t<i} la_t − r_i},
    (N, N) per head for a scalar gate (la (B, N, H, 1)), (N, N) per head and channel for a channel
    gate (la (B, N, H, M)); r_i their largest over the chunks i − whole ≤ j < i (and the
    channels), so each weight is ≤ 1, formed from its own segment sum, as the doubling's merges
    are. One batched matrix product instead of log2(whole) elementwise merges of (M, E) sums."""
    nc, gc = kv.shape[1], la.shape[-1]
    inclusive = segment_sums(la, 1)  # (B, N_i, N_j, H, G): Σ_{j<t≤i}
    lag = torch.cat([torch.zeros_like(inclusive[:, :1]), inclusive[:, :-1]], dim=1)  # Σ_{j<t<i}
    i = torch.arange(nc, device=kv.device)
    reach = (i[None, :] < i[:, None]) & (i[None, :] >= i[:, None] - whole)  # (N_i, N_j)
    exponent = (ref[:, None, :, :, None] + lag).masked_fill(~reach[None, :, :, None, None], -math.inf)
    r = exponent.detach().amax(dim=(2, 4))  # (B, N_i, H)
    weights = torch.exp(exponent - r.masked_fill(r == -math.inf, 0.0)[:, :, None, :, None])
    if gc == 1:
        return torch.einsum("bijh,bjhme->bihme", weights[..., 0], kv), r
    return torch.einsum("bijhm,bjhme->bihme", weights, kv), r


def _lags(g: Tensor, cuts: list[tuple[int, Tensor]]) -> list[Tensor]:
    """For each cut shift s: Σ of the gates from key d of chunk i − s (excluded) to query j of
    chunk i (included), (B, N − s, C_j, C_d, H, G), added from terms all ≤ 0 (no subtraction):
    the segment sums inside a chunk (s = 0); else to the key's chunk's end + the chunks
    between + from the query's chunk's start."""
    from_start, to_end, total = torch.cumsum(g, dim=2), suffix_sums(g, dim=2), g.sum(dim=2)
    nc, out = g.shape[1], []
    for shift, _ in cuts:
        if shift == 0:
            out.append(segment_sums(g, dim=2))
            continue
        between = torch.zeros_like(total[:, shift:])
        for back in range(1, shift):  # the whole chunks i − shift + 1 … i − 1
            between = between + total[:, shift - back:nc - back]
        out.append(from_start[:, shift:, :, None] + to_end[:, :nc - shift, None] + between[:, :, None, None])
    return out


def gated_causal_sums(phi_q: Tensor, phi_k: Tensor, values: Tensor, gates: Tensor, log_scale: Tensor,
                      chunk_size: int, *, window: int | None = None, state: Tensor | None = None,
                      state_scale: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """Unnormalised gated causal sums, relative to e^{top_m} (which depends on the scales and
    gates only, so that a numerator and a normaliser summed apart can be divided).

    Args:
        phi_q: (B, L, H, M) query features.
        phi_k: (B, L, H, M) key features relative to e^{a_n}.
        values: (B, L, H, E).
        gates: (B, L, H, G) log gates ≤ 0 (:func:`spe.ops.decay.forms.check_gates`).
        log_scale: (B, L, H) a_n (zeros for keys without log scales).
        chunk_size: C (at most :data:`CHANNEL_CHUNK` for a channel gate).
        window: W < L, keys m − W < n ≤ m; None: the whole past.
        state: (B, H, M, E) Σ of earlier keys relative to e^{state_scale} (B, H), at position
            −1 (the first gate decays it); whole past only.

    Returns:
        (B, L, H, E) sums, top (B, L, H) (detached); with the whole past, the final state
        (B, H, M, E) relative to its scale (B, H) (the decayed running maximum at L − 1), else
        None, None.
    """
    b, n, h, m = phi_q.shape
    e, gc = values.shape[-1], gates.shape[-1]
    factorable = False
    if gc > 1 and window is None:
        # a channel gate on keys without log scales factors its in-chunk weights
        # (_factored_chunk_sums), so its chunks need not be short. Keys at the floor scale weigh
        # e^{−10³⁰} = 0 exactly (padding; the encoder's backward pass's key beyond the end): as
        # zero keys of scale 0 they leave every sum as it was and the call factorable.
        dead = log_scale.detach() <= FLOOR_LOG_SCALE
        factorable = not bool(log_scale.detach().masked_fill(dead, 0.0).ne(0).any())
        if factorable and bool(dead.any()):
            phi_k, log_scale = phi_k.masked_fill(dead[..., None], 0.0), log_scale.masked_fill(dead, 0.0)
    c = max(1, min(chunk_size, n, CHANNEL_CHUNK if gc > 1 and not factorable else n))
    pad = (-n) % c  # padded keys: zero, with no scale (FLOOR) and gates 0 (the final state does not decay)
    phi_q, phi_k, values, gates = (_pad_time(t, pad) for t in (phi_q, phi_k, values, gates))
    log_scale = _pad_time(log_scale, pad, FLOOR_LOG_SCALE)
    nc = phi_q.shape[1] // c
    q, k = phi_q.reshape(b, nc, c, h, m), phi_k.reshape(b, nc, c, h, m)
    vv, g, a = values.reshape(b, nc, c, h, e), gates.reshape(b, nc, c, h, gc), log_scale.reshape(b, nc, c, h)
    if window is None:
        whole, cuts = nc + (state is not None), [(0, torch.ones(c, c, dtype=torch.bool, device=q.device).tril())]
    else:
        whole, cuts, _ = window_plan(c, window, nc, q.device)
        whole = min(whole, nc)

    # the whole chunks: each chunk's keys decayed to its end, relative to their largest scale
    to_end = a[..., None] + suffix_sums(g, dim=2)  # (B, N, C, H, G)
    ref = to_end.detach().amax(dim=(2, 4))  # (B, N, H)
    kv = torch.einsum("bnchm,bnche->bnhme", k * torch.exp(to_end - ref[:, :, None, :, None]), vv)
    la = g.sum(dim=2)  # (B, N, H, G)
    if state is not None:  # a chunk before the first, ending at position −1
        kv, ref = torch.cat([state[:, None].to(kv), kv], 1), torch.cat([state_scale[:, None].to(ref), ref], 1)
        la = torch.cat([torch.zeros_like(la[:, :1]), la], 1)
    if window is None:  # a chunk after the last, empty: what it reads is the final state
        kv, la = torch.cat([kv, torch.zeros_like(kv[:, :1])], 1), torch.cat([la, torch.zeros_like(la[:, :1])], 1)
        ref = torch.cat([ref, torch.full_like(ref[:, :1], -math.inf)], 1)
    first = int(state is not None)
    # the (N, N) product costs N²·M·E, the doubling N·log2(N)·M·E in elementwise passes: the product
    # wins up to SCALAR_PRODUCT_CHUNKS (scalar) or CHANNEL_PRODUCT_CHUNKS chunks; a window keeps doubling
    # (its reach of a few chunks would leave most of the product's weights zero)
    limit = SCALAR_PRODUCT_CHUNKS if gc == 1 else CHANNEL_PRODUCT_CHUNKS
    product = window is None and kv.shape[1] <= limit
    before = _chunks_before_product if product else _chunks_before
    between, between_ref = before(kv, ref, la, whole) if whole else (None, None)
    read = None if between is None else between_ref[:, first:first + nc, None, :, None] + torch.cumsum(g, dim=2)

    if factorable:
        out, top = _factored_chunk_sums(q, k, vv, g, read, None if between is None else between[:, first:first + nc])
        return _finish(out, top, n, between, between_ref, window)
    lags = _lags(g, cuts)
    # top_j: the largest decayed scale in reach (the query's own key always is)
    top = torch.full_like(a, -math.inf)
    for (shift, mask), lag in zip(cuts, lags, strict=True):
        seen = (a[:, :nc - shift, None, :, :] + lag.detach().amax(-1)).masked_fill(~mask[..., None], -math.inf)
        top = torch.cat([top[:, :shift], torch.maximum(top[:, shift:], seen.amax(dim=3))], dim=1)
    if read is not None:
        top = torch.maximum(top, read.detach().amax(-1))

    out = torch.zeros(b, nc, c, h, e, dtype=values.dtype, device=values.device)
    for (shift, mask), lag in zip(cuts, lags, strict=True):
        exponent = lag + (a[:, :nc - shift, None, :, :] - top[:, shift:, :, None, :])[..., None]
        factor = torch.exp(exponent.masked_fill(~mask[..., None, None], 0.0))
        qi, kj = q[:, shift:], k[:, :nc - shift]
        if gc == 1:
            scores = torch.einsum("bnchm,bndhm->bnhcd", qi, kj) * factor[..., 0].permute(0, 1, 4, 2, 3)
        else:
            scores = torch.einsum("bnchm,bndhm,bncdhm->bnhcd", qi, kj, factor)
        part = torch.einsum("bnhcd,bndhe->bnche", scores.masked_fill(~mask, 0.0), vv[:, :nc - shift])
        out = torch.cat([out[:, :shift], out[:, shift:] + part], dim=1) if shift else out + part
    if read is not None:  # query j reads the chunks before with the gates from its chunk's start
        qr = q * torch.exp(read - top[..., None])
        out = out + torch.einsum("bnchm,bnhme->bnche", qr, between[:, first:first + nc])
    return _finish(out, top, n, between, between_ref, window)


def _finish(out: Tensor, top: Tensor, n: int, between: Tensor | None, between_ref: Tensor | None,
            window: int | None) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    # out (B, N, C, H, E), top (B, N, C, H): back to positions, the padding dropped
    out, top = out.flatten(1, 2)[:, :n], top.flatten(1, 2)[:, :n]
    if window is not None:
        return out, top, None, None
    return out, top, between[:, -1], between_ref[:, -1]


# Largest exponent of a key's factor in the factored channel-gate weights: e^{60} keeps every
# product a masked (future) pair forms finite in float32 (e^{88}).
FACTOR_EXPONENT_LIMIT = 60.0


def _factored_chunk_sums(q: Tensor, k: Tensor, vv: Tensor, g: Tensor, read: Tensor | None,
                         between: Tensor | None) -> tuple[Tensor, Tensor]:
    """The in-chunk and earlier-chunk sums of a channel gate over keys without log scales, the
    in-chunk weights factored (GLA's sub-chunk form): with F the gates summed from the chunk's
    start (≤ 0, non-increasing),

        e^{Σ_{d<t≤j} G_t − top_j} = e^{F_j − top_j} · e^{−F_d},

    two (C, M) factors and one matrix product instead of the exact form's (C, C, M) weights.
    A query j whose keys need e^{−F_d} beyond e^{FACTOR_EXPONENT_LIMIT} (the chunk's gates up to
    j sum below −60 nats in some channel; −F_d ≤ −F_j for d ≤ j) takes the sub-chunk form
    instead (:func:`_sub_chunk_sums`); the choice depends on gates up to j only, so outputs stay
    causal to the bit. Keys' factors are clamped there, which changes only pairs the causal mask
    drops.
    top_j is the exact form's: with every key scale 0 the query's own key (weight e^0) is the
    largest in the chunk, so top_j = max(0, the earlier chunks' largest).

    q, k: (B, N, C, H, M); vv: (B, N, C, H, E); g: (B, N, C, H, M); read: (B, N, C, H, M) log
    weights of the earlier chunks' sums at each query, between (B, N, H, M, E) those sums (the
    chunks before each chunk).
    Returns (out (B, N, C, H, E), top (B, N, C, H)).
    """
    c = q.shape[2]
    top = torch.zeros(q.shape[:-1], dtype=q.dtype, device=q.device)
    if read is not None:
        top = torch.maximum(top, read.detach().amax(-1))
    f = torch.cumsum(g, dim=2)
    mask = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    scores = torch.einsum("bnchm,bndhm->bnhcd", q * torch.exp(f - top[..., None]),
                          k * torch.exp((-f).clamp(max=FACTOR_EXPONENT_LIMIT)))
    out = torch.einsum("bnhcd,bndhe->bnche", scores.masked_fill(~mask, 0.0), vv)
    sub_chunk_rows = (-f.detach()).amax(-1) > FACTOR_EXPONENT_LIMIT  # (B, N, C, H)
    if bool(sub_chunk_rows.any()):
        out = torch.where(sub_chunk_rows[..., None], _sub_chunk_sums(q, k, vv, g, f, top), out)
    if read is not None:  # query j reads the chunks before with the gates from its chunk's start
        out = out + torch.einsum("bnchm,bnhme->bnche", q * torch.exp(read - top[..., None]), between)
    return out, top


def _sub_chunk_sums(q: Tensor, k: Tensor, vv: Tensor, g: Tensor, f: Tensor, top: Tensor) -> Tensor:
    """The in-chunk sums of a channel gate for any gates (GLA's secondary chunking): the chunk
    cut into sub-chunks of :data:`CHANNEL_CHUNK`; a key d of an earlier sub-chunk u reaches
    query j through

        e^{F_j − F_{e_u} − top_j} · e^{F_{e_u} − F_d},   e_u the last position of u,

    both factors ≤ 1 (F non-increasing), one matrix product per sub-chunk of keys; keys of the
    query's own sub-chunk by exact (S, S, M) weights. Costs C²·M + C·S·M a chunk where the
    exact (C, C, M) form costs C²·M elementwise and its memory: a gate that learned to forget
    fast in some channel (rows past −60 nats) no longer multiplies a step's time.

    q, k: (B, N, C, H, M); vv: (B, N, C, H, E); g, f: (B, N, C, H, M) gates and their sums from
    the chunk's start; top: (B, N, C, H). Returns (B, N, C, H, E): the keys of the query's own
    chunk only (the caller adds the earlier chunks').
    """
    b, nc, c, h, m = q.shape
    s = min(CHANNEL_CHUNK, c)
    pad = (-c) % s  # padded keys and queries are zero, their gates 0 (F stays at the chunk's last)
    if pad:
        q, k, vv, g = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, vv, g))
        f = torch.cat([f, f[:, :, -1:].expand(-1, -1, pad, -1, -1)], dim=2)
        top = F.pad(top, (0, 0, 0, pad))
    u, e = (c + pad) // s, vv.shape[-1]
    sub = lambda t: t.reshape(b, nc, u, s, *t.shape[3:])  # noqa: E731
    end = sub(f)[:, :, :, -1]  # (B, N, U, H, M): F at each sub-chunk's last position
    own = torch.arange(c + pad, device=q.device) // s
    earlier = own[:, None] > torch.arange(u, device=q.device)[None, :]  # (C', U): sub-chunk u before j's
    reach = (f[:, :, :, None] - end[:, :, None] - top[:, :, :, None, :, None]).masked_fill(
        ~earlier[..., None, None], -math.inf)  # (B, N, C', U, H, M), ≤ 0 where kept
    keys = sub(k * torch.exp(end.repeat_interleave(s, dim=2) - f))
    inter = torch.einsum("bncuhm,bnushm->bnhcus", q[:, :, :, None] * torch.exp(reach), keys)
    out = torch.einsum("bnhcd,bndhe->bnche", inter.reshape(b, nc, h, c + pad, c + pad), vv)
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    factor = torch.exp((segment_sums(sub(g), dim=3) - sub(top)[:, :, :, :, None, :, None]).masked_fill(
        ~mask[..., None, None], 0.0))  # (B, N, U, S, S, H, M)
    intra = torch.einsum("bnushm,bnuthm,bnusthm->bnuhst", sub(q), sub(k), factor).masked_fill(~mask, 0.0)
    out = out + torch.einsum("bnuhst,bnuthe->bnushe", intra, sub(vv)).reshape(b, nc, c + pad, h, e)
    return out[:, :, :c]


# Shortest chunk :func:`encoder_scalar_chunk` picks: below it the per-chunk passes cost more than
# the (C, C) weights they save.
MIN_ENCODER_CHUNK = 16


def encoder_scalar_chunk(length: int, features: int, value_dim: int, chunk_size: int) -> int:
    """The chunk length of an encoder's scalar-gate passes: the power of two nearest to
    ∛(2·L·M·E / (M + E)), at least :data:`MIN_ENCODER_CHUNK`, at most ``chunk_size``.

    Each pass forms exact (C, C) weights inside every chunk, ∝ L·C·(M + E), and sums the
    chunks before each chunk by one (N, N) product, ∝ (L/C)²·M·E; that C minimises the sum.
    ListOps' cpu-small encoder (L ≈ 170, M = 32 features, E = 17 with the normaliser) gets 16
    instead of 64: its training step 1.7× faster. :func:`spe.ops.linear_attn.chunk.linear_attention` takes it
    for a scalar gate (one C for the numerator and the normaliser, so that their references
    match to the bit); causal calls keep the caller's chunk.

    Args:
        length: L; features: M; value_dim: E (values and the normaliser's ones); chunk_size:
            the caller's C, an upper bound.

    Returns:
        C, 1 ≤ C ≤ chunk_size.
    """
    best = (2.0 * length * features * value_dim / (features + value_dim)) ** (1.0 / 3.0)
    power = 2 ** round(math.log2(max(best, 1.0)))
    return max(1, min(chunk_size, max(MIN_ENCODER_CHUNK, power)))


def gated_bidirectional_sums(phi_q: Tensor, phi_k: Tensor, values: Tensor, log_scale: Tensor, gates: Tensor,
                             chunk_size: int) -> tuple[Tensor, Tensor]:
    """Σ_n exp(Σ_{min(m,n)<t≤max(m,n)} G_t) φ(q_m)ᵀ f_n e^{a_n} values_n for every m (the gates of
    the positions between n and m, the later one's included: e^{G_t} separates t − 1 from t
    in both directions; a constant gate gives γ^{|m−n|}), unnormalised, relative to e^{top_m}.

    A forward causal pass (n ≤ m) and a backward one over the reversed sequence for n > m,
    with the keys shifted by one (so the diagonal counts once); every later key first crosses
    G_{m+1}, which goes on the query (a factor ≤ 1), the gates beyond it on the pass.

    Args:
        phi_q, phi_k: (B, L, H, M), keys relative to e^{a_n}; values: (B, L, H, E);
        log_scale: (B, L, H) a_n (zeros without key scales; padding at −∞ or FLOOR);
        gates: (B, L, H, G); chunk_size: C of the passes.

    Returns:
        (B, L, H, E) sums, top (B, L, H).
    """
    a = log_scale.clamp(min=FLOOR_LOG_SCALE)  # −∞ (padding) would meet −∞ − (−∞)
    forward, top_f, _, _ = gated_causal_sums(phi_q, phi_k, values, gates, a, chunk_size)

    def next_one(t: Tensor, fill: float = 0.0) -> Tensor:  # position m holds m + 1's
        return torch.cat([t[:, 1:], torch.full_like(t[:, :1], fill)], dim=1)

    def rev(t: Tensor) -> Tensor:
        return t.flip(1)

    g_next = next_one(gates)  # G_{m+1}, 0 after the last position
    # reversed position r holds m = L − 1 − r; the pass's gate at r is G_{L+1−r} = g_next at r − 1
    g_pass = torch.cat([torch.zeros_like(gates[:, :1]), rev(g_next)[:, :-1]], dim=1)
    backward, top_b, _, _ = gated_causal_sums(rev(phi_q * torch.exp(g_next)), rev(next_one(phi_k)),
                                              rev(next_one(values)), g_pass, rev(next_one(a, FLOOR_LOG_SCALE)),
                                              chunk_size)
    backward, top_b = rev(backward), rev(top_b)
    top = torch.maximum(top_f, top_b)
    return forward * torch.exp(top_f - top)[..., None] + backward * torch.exp(top_b - top)[..., None], top

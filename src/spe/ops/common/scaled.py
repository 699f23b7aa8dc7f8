"""Causal linear-attention sums for keys given with a log scale: φ(k_n) = f_n · exp(a_n).

Letters: B = batch, L = length, H = num_heads, M = features, E = value dimension, C = chunk.

FAVOR+ key features exp(ω_j k' − ‖k'‖²/2) have no absolute scale (their exponent reaches
‖ω_j‖²/2 ≈ R/2, beyond float32 at a large test-time R). Keys therefore come as features
f_n ≤ 1 and a log scale a_n (:func:`spe.ops.common.feature_maps.favor_key_features`), and the sums
are kept relative to the causal running maximum c_m = max_{n ≤ m} a_n: query m uses
Σ_{n ≤ m} φ(q_m)ᵀ f̃_n e^{c_n − c_m} v_n with f̃_n = f_n e^{a_n − c_n}. Every factor is ≤ 1, so
nothing overflows; the common e^{c_m} cancels in each query's ratio; c depends on past keys
only, so outputs stay causal and the recurrent step (which keeps c in its state) matches.
The caller passes f̃ (``phi_k``) and c (``scale``). Sliding windows instead take each key
relative to its own scale and c_m = the largest a_n inside the window
(:func:`scaled_window_sums`), so that a window forgets what left it, bit for bit.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["running_max", "scaled_causal_sums", "scaled_window_sums", "window_plan"]


def running_max(a: Tensor, previous: Tensor | None = None) -> Tensor:
    """c_m = max(previous, a_0 … a_m) along dim 1; a (B, L, H), previous (B, H) or None."""
    if previous is not None:
        a = torch.cat([previous[:, None].to(a), a], dim=1)
    c = torch.cummax(a, dim=1).values
    return c if previous is None else c[:, 1:]


def _pad_chunks(c: int, *tensors: Tensor) -> list[Tensor]:
    n = tensors[0].shape[1]
    pad = (-n) % c
    if not pad:
        return list(tensors)
    out = []
    for t in tensors:  # zero keys add nothing; scales repeat the last one (still monotone)
        if t.dim() == 3:
            out.append(torch.cat([t, t[:, -1:].expand(-1, pad, -1)], dim=1))
        else:
            out.append(F.pad(t, (0, 0, 0, 0, 0, pad)))
    return out


def _intra(q: Tensor, k: Tensor, vv: Tensor, cq: Tensor, ck: Tensor, mask: Tensor, *,
           lag_log: Tensor | None = None) -> Tensor:
    """Σ over one chunk's keys (or a shifted one) of (q·k) e^{c_n − c_m} v_n, masked; q (…, C, H, M).
    ``lag_log``: (C, C, H) (j − d)·λ added to the exponent (decay), or None."""
    scores = torch.einsum("bnchm,bndhm->bnhcd", q, k)
    exponent = ck[:, :, None, :, :] - cq[:, :, :, None, :]
    if lag_log is None:
        exponent = exponent.clamp(max=0.0)
    else:  # masked, not clamped: a clamp would cut λ's gradient where rounding lifts a 0 above 0
        exponent = (exponent + lag_log).masked_fill(~mask[..., None], 0.0)
    factor = torch.exp(exponent).permute(0, 1, 4, 2, 3)
    return torch.einsum("bnhcd,bndhe->bnche", (scores * factor).masked_fill(~mask, 0.0), vv)


def scaled_causal_sums(phi_q: Tensor, phi_k: Tensor, values: Tensor, scale: Tensor, chunk_size: int, *,
                       state: Tensor | None, state_scale: Tensor | None,
                       log_decay: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Σ_{n ≤ m} φ(q_m)ᵀ f̃_n e^{c_n − c_m} γ^{m−n} values_n, chunked, all chunks at once.

    Chunk j's state is relative to its last scale; the prefix over chunks is a log-depth
    scan (Hillis–Steele) whose merges x e^{r_x − r_y} γ^{dC} + y have factors ≤ 1, since the
    (decayed) running maximum satisfies r_y ≥ r_x + dC·λ. With a decay (:mod:`spe.ops.decay`)
    the only powers formed are γ^{lag} for lags inside a chunk, γ^{dC} between chunks and
    γ^{(i+1)C} on the initial state, each inside one exponent with the scales (≤ 0).
    O(L/C · log(L/C)) state updates, no sequential loop.

    Args:
        phi_q, phi_k: (B, L, H, M); values: (B, L, H, E); scale: c, (B, L, H), the running
            maximum (:func:`running_max`; with a decay, :func:`~spe.ops.decay.decayed_running_max`).
        state: (B, H, M, E) Σ of earlier keys relative to ``state_scale`` (B, H), or None.
        log_decay: (H,) λ = log γ, or None (no decay).

    Returns:
        (B, L, H, E) sums, the final state (B, H, M, E) relative to the final scale (B, H).
    """
    b, n, h, m = phi_q.shape
    c = max(1, min(chunk_size, n))
    pad = (-n) % c
    phi_q, phi_k, values, scale = _pad_chunks(c, phi_q, phi_k, values, scale)
    nc, e = phi_q.shape[1] // c, values.shape[-1]
    q, k = phi_q.reshape(b, nc, c, h, m), phi_k.reshape(b, nc, c, h, m)
    vv, cs = values.reshape(b, nc, c, h, e), scale.reshape(b, nc, c, h)
    ends = cs[:, :, -1]  # (B, N, H)
    lam = None if log_decay is None else log_decay.to(phi_q)
    offsets = torch.arange(c, device=values.device)
    key_exp = cs - ends[:, :, None]
    if lam is not None:  # each key decays to its chunk's end
        key_exp = key_exp + (c - 1 - offsets).to(lam)[:, None] * lam
    sums = torch.einsum("bnchm,bnche->bnhme", k * torch.exp(key_exp)[..., None], vv)
    d = 1
    while d < nc:  # inclusive prefix over chunks, each relative to its own end scale
        rel = ends[:, :-d] - ends[:, d:] if lam is None else ends[:, :-d] - ends[:, d:] + d * c * lam
        sums = torch.cat([sums[:, :d], sums[:, :-d] * torch.exp(rel)[..., None, None] + sums[:, d:]], dim=1)
        d *= 2
    if state is None:
        state, state_scale = phi_q.new_zeros(b, h, m, e), cs[:, 0, 0]
    else:
        rel = state_scale[:, None] - ends
        if lam is not None:  # the state is at position −1, chunk i's end at (i + 1)C − 1
            rel = rel + torch.arange(1, nc + 1, device=values.device).to(lam)[:, None] * c * lam
        sums = sums + state[:, None] * torch.exp(rel)[..., None, None]
    before = torch.cat([state[:, None], sums[:, :-1]], dim=1)  # exclusive prefix (B, N, H, M, E)
    before_scale = torch.cat([state_scale[:, None], ends[:, :-1]], dim=1)  # (B, N, H)
    mask = torch.ones(c, c, dtype=torch.bool, device=values.device).tril()
    read = before_scale[:, :, None] - cs
    lag_log = None
    if lam is not None:  # query j of a chunk reads the state of the chunk before with γ^{j+1}
        read = read + (offsets + 1).to(lam)[:, None] * lam
        lag_log = (offsets[:, None] - offsets[None, :]).to(lam)[..., None] * lam
    out = torch.einsum("bnchm,bnhme->bnche", q, before) * torch.exp(read)[..., None]
    out = out + _intra(q, k, vv, cs, cs, mask, lag_log=lag_log)
    final, final_scale = sums[:, -1], ends[:, -1]
    if lam is not None and pad:  # the padded end would have decayed the state by γ^pad
        final, final_scale = _final_state(k[:, -1, :c - pad], vv[:, -1, :c - pad], cs[:, -1, :c - pad],
                                          before[:, -1], before_scale[:, -1], lam)
    return out.reshape(b, nc * c, h, e)[:, :n], final, final_scale


def _final_state(k: Tensor, vv: Tensor, cs: Tensor, before: Tensor, before_scale: Tensor,
                 lam: Tensor) -> tuple[Tensor, Tensor]:
    """The state after the r real positions of a padded last chunk, relative to its last scale:
    k (B, r, H, M), vv (B, r, H, E), cs (B, r, H); before (B, H, M, E) relative to
    before_scale (B, H), the state before the chunk."""
    r = k.shape[1]
    end = cs[:, -1]
    lag = (r - 1 - torch.arange(r, device=k.device)).to(lam)
    weights = torch.exp(cs - end[:, None] + lag[:, None] * lam)[..., None]
    carried = before * torch.exp(before_scale + r * lam - end)[..., None, None]
    return carried + torch.einsum("brhm,brhe->bhme", k * weights, vv), end


# Log scale of empty blocks (before the first chunk) and of keys outside a window: −∞, so that
# they can never be the larger scale (a finite sentinel such as −10⁴ would be, once every real
# key's log scale lies below it, and then underflow every real key's factor to 0).
_FAR = -math.inf


def _merge(x: Tensor, rx: Tensor, y: Tensor, ry: Tensor) -> tuple[Tensor, Tensor]:
    """x e^{rx} + y e^{ry} as (sum, scale) relative to the larger scale; x, y (B, N, H, M, E).
    Two empty blocks (both scales −∞, both sums 0) merge to an empty block."""
    r = torch.maximum(rx, ry)
    ref = r.masked_fill(r == _FAR, 0.0)  # e^{−∞ − 0} = 0, where e^{−∞ − (−∞)} would be NaN
    return x * torch.exp(rx - ref)[..., None, None] + y * torch.exp(ry - ref)[..., None, None], r


def _scaled_chunk_window_sums(kv: Tensor, ref: Tensor, whole: int,
                              chunk_log: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Σ_{i − whole ≤ j < i} kv[:, j] e^{ref_j} γ^{C(i−1−j)} as (sum, scale) for each chunk i, by doubling.

    kv (B, N, H, M, E) relative to ref (B, N, H); ``chunk_log``: (H,) C·λ, the log decay over
    one chunk (None: no decay; each block is then relative to the end of its last chunk, an
    earlier block's scale shifted by C·λ per chunk it lies back). Blocks of 2^p chunks and the
    running result are merged relative to their larger scale (every factor ≤ 1), from the
    window's own chunks only: nothing outside the window can change the result, not even by
    rounding.
    """
    nc = kv.shape[1]
    block = torch.cat([torch.zeros_like(kv[:, :whole]), kv], dim=1)
    bref = torch.cat([torch.full_like(ref[:, :1], _FAR).expand(-1, whole, -1), ref], dim=1)
    between, between_ref = torch.zeros_like(kv), torch.full_like(ref, _FAR)
    covered, size = 0, 1
    while size <= whole:
        if whole & size:
            covered += size
            lo = whole - covered
            back = bref[:, lo:lo + nc]  # this block ends covered − size chunks before chunk i − 1 does
            if chunk_log is not None:
                back = back + (covered - size) * chunk_log
            between, between_ref = _merge(between, between_ref, block[:, lo:lo + nc], back)
        if 2 * size <= whole:
            early = bref[:, :-size] if chunk_log is None else bref[:, :-size] + size * chunk_log
            block, bref = _merge(block[:, :-size], early, block[:, size:], bref[:, size:])
        size *= 2
    return between, between_ref


def window_plan(c: int, window: int, nc: int, device) -> tuple[int, list[tuple[int, Tensor]], Tensor]:
    """Chunk shifts wholly inside the window (1 … whole) and those it cuts, with their masks
    over (query offset, key offset); and the in-chunk lags j − d (C, C)."""
    offsets = torch.arange(c, device=device)
    lag0 = offsets[:, None] - offsets[None, :]
    whole, cuts = 0, []
    for shift in range((window + c - 1) // c + 1):
        mask = (shift * c + lag0 >= 0) & (shift * c + lag0 < window)
        if shift >= 1 and bool(mask.all()):
            whole = shift
        elif bool(mask.any()) and shift < nc:
            cuts.append((shift, mask))
    return whole, cuts, lag0


def scaled_window_sums(phi_q: Tensor, phi_k: Tensor, values: Tensor, log_scale: Tensor, chunk_size: int,
                       window: int, *, log_decay: Tensor | None = None) -> Tensor:
    """Σ_{m − W < n ≤ m} φ(q_m)ᵀ f_n e^{a_n − c_m} γ^{m−n} values_n for W < L; (B, L, H, E).

    Here f_n is relative to the key's own scale a_n (``log_scale``, not a running maximum) and
    c_m is the largest a_n (+ (m − n) λ with a decay, ``log_decay`` (H,) λ = log γ) inside
    query m's window, so the result depends on the window's keys only. Whole chunks inside
    the window: doubling sums (no subtraction); the chunks the window cuts: masked C × C
    products.
    """
    b, n, h, m = phi_q.shape
    c = max(1, min(chunk_size, n))
    phi_q, phi_k, values, log_scale = _pad_chunks(c, phi_q, phi_k, values, log_scale)
    nc, e = phi_q.shape[1] // c, values.shape[-1]
    q, k = phi_q.reshape(b, nc, c, h, m), phi_k.reshape(b, nc, c, h, m)
    vv, ak = values.reshape(b, nc, c, h, e), log_scale.reshape(b, nc, c, h)
    whole, cuts, lag0 = window_plan(c, window, nc, values.device)
    lam = None if log_decay is None else log_decay.to(phi_q)

    def lagged(shift: int) -> Tensor:  # a_n (+ lag·λ) of the keys a shifted chunk offers each query
        keys = ak[:, :nc - shift, None, :, :]  # (B, N', 1, Ck, H)
        return keys if lam is None else keys + ((shift * c + lag0).to(lam)[..., None] * lam)

    # c_m: the largest (decayed) key scale in the window (the query's own key is always in it)
    top = torch.full_like(ak, _FAR)
    for shift, mask in cuts:
        seen = lagged(shift).expand(-1, -1, c, -1, -1).masked_fill(~mask[None, None, :, :, None], _FAR).amax(dim=3)
        top = torch.cat([top[:, :shift], torch.maximum(top[:, shift:], seen)], dim=1)
    between = None
    if whole:
        offsets = torch.arange(c, device=values.device)
        to_end = ak if lam is None else ak + (c - 1 - offsets).to(lam)[:, None] * lam
        ref = to_end.amax(dim=2)  # (B, N, H): each chunk relative to its largest (decayed) key
        kv = torch.einsum("bnchm,bnche->bnhme", k * torch.exp(to_end - ref[:, :, None])[..., None], vv)
        between, between_ref = _scaled_chunk_window_sums(kv, ref, min(whole, nc), None if lam is None else c * lam)
        read_ref = between_ref[:, :, None] if lam is None else (
            between_ref[:, :, None] + (offsets + 1).to(lam)[:, None] * lam)  # query j reads with γ^{j+1}
        top = torch.maximum(top, read_ref)
    out = torch.zeros(b, nc, c, h, e, dtype=values.dtype, device=values.device)
    for shift, mask in cuts:
        scores = torch.einsum("bnchm,bndhm->bnhcd", q[:, shift:], k[:, :nc - shift])
        exponent = lagged(shift) - top[:, shift:, :, None, :]
        # no clamp with a decay (it would cut λ's gradient where rounding lifts a 0 above 0): the mask
        exponent = exponent.clamp(max=0.0) if lam is None else exponent.masked_fill(~mask[..., None], 0.0)
        factor = torch.exp(exponent)
        scores = (scores * factor.permute(0, 1, 4, 2, 3)).masked_fill(~mask, 0.0)
        part = torch.einsum("bnhcd,bndhe->bnche", scores, vv[:, :nc - shift])
        out = torch.cat([out[:, :shift], out[:, shift:] + part], dim=1)
    if between is not None:
        factor = torch.exp((read_ref - top).clamp(max=0.0) if lam is None else read_ref - top)[..., None]
        out = out + torch.einsum("bnchm,bnhme->bnche", q, between) * factor
    return out.reshape(b, nc * c, h, e)[:, :n]

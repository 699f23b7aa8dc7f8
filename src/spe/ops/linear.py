"""Linear attention kernels (Katharopoulos et al. 2020), causal and not, in O(N) memory.

Letters: B = batch, L = length, H = num_heads, M = feature dimension of φ, E = value dimension.

    y_m = Σ_n φ(q_m)ᵀ φ(k_n) v_n / Σ_n φ(q_m)ᵀ φ(k_n),   n ≤ m when causal.

:func:`causal_linear_attention` is the chunked algorithm (masked C × C products inside a
chunk, a carried state S = Σ φ(k_n) v_nᵀ across chunks); its slow, obviously correct twin
:func:`causal_linear_attention_reference` uses cumulative sums of (M × E) outer products, and
its recurrent twin :func:`spe.ops.recurrent.linear_attention_step` continues from the
:class:`~spe.ops.state.LinearAttentionState` it returns with ``output_final_state=True``.

The normaliser has no fixed ε (:func:`normalise`); all sums run in at least float32 with
autocast off.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from spe.ops.scaled import running_max, scaled_causal_sums, scaled_window_sums
from spe.ops.softmax import check_window
from spe.ops.state import LinearAttentionState, check_state_window

__all__ = ["causal_linear_attention", "causal_linear_attention_reference", "kernel_dtype", "linear_attention",
           "normalise"]


def _full_precision(fn):
    """Runs a kernel in at least float32 with autocast off, returning the values' dtype.

    The carried state sums up to L outer products: in bfloat16/float16 it would lose most of
    its precision (and overflow in float16) long before L = 10⁴. Tensors in ``initial_state``
    and ``normalizer`` are promoted too; a returned final state stays in the kernel's dtype.
    """

    @functools.wraps(fn)
    def wrapper(phi_q: Tensor, phi_k: Tensor, v: Tensor, **kwargs):
        dtype = kernel_dtype(phi_q, v)
        if kwargs.get("normalizer") is not None:
            kwargs["normalizer"] = tuple(t.to(dtype) for t in kwargs["normalizer"])
        for name in ("initial_state", "key_log_scale"):
            if kwargs.get(name) is not None:
                kwargs[name] = kwargs[name].to(dtype)
        with torch.autocast(device_type=v.device.type, enabled=False):
            out = fn(phi_q.to(dtype), phi_k.to(dtype), v.to(dtype), **kwargs)
        if isinstance(out, tuple):
            return out[0].to(v.dtype), out[1]
        return out.to(v.dtype)

    return wrapper


def kernel_dtype(*tensors: Tensor) -> torch.dtype:
    """The dtype the kernels compute in: the widest of the inputs', at least float32."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _with_ones(v: Tensor) -> Tensor:
    # A trailing column of ones makes the normaliser Σ φ(q)ᵀφ(k) come out of the same products.
    return torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)


def normalise(num: Tensor, den: Tensor, eps: float = 0.0) -> Tensor:
    """num / (den + eps), with 0 where that denominator is exactly 0.

    With non-negative features den = Σ_n φ(q_m)ᵀφ(k_n) ≥ 0 and num is the same weighted sum
    of values, so the ratio is a weighted mean of values for any den > 0, however small: a
    fixed ε would instead shrink outputs whose den falls near it (FAVOR+ key features have no
    absolute scale; issue 12, defect 1). den = 0 means no key has any weight (ReLU features):
    the output is then 0, with zero gradient.

    Args:
        num: (…, E) numerators.
        den: (…, 1) denominators.
        eps: added to den (0: none; kept for callers that relied on the old ε = 1e-6).
    """
    den = den + eps if eps else den
    nonzero = den != 0
    return torch.where(nonzero, num / torch.where(nonzero, den, torch.ones_like(den)), torch.zeros_like(num))


def _normalised(num_den: Tensor, eps: float) -> Tensor:
    return normalise(num_den[..., :-1], num_den[..., -1:], eps)


def _rescale_keys(phi_k: Tensor, normalizer, key_log_scale: Tensor | None):
    """Keys brought to one common scale, e^{a_n − max a} (for non-causal use and references)."""
    if key_log_scale is None:
        return phi_k, normalizer
    factor = torch.exp(key_log_scale - key_log_scale.amax(dim=1, keepdim=True))[..., None]
    return phi_k * factor, None if normalizer is None else (normalizer[0], normalizer[1] * factor)


def _check_normalizer(normalizer, phi_q: Tensor, phi_k: Tensor) -> tuple[Tensor, Tensor]:
    nq, nk = normalizer
    if nq.shape[:-1] != phi_q.shape[:-1] or nk.shape[:-1] != phi_k.shape[:-1]:
        raise ValueError(f"normalizer features must match the queries' and keys' (batch, length, heads), got "
                         f"{tuple(nq.shape)} and {tuple(nk.shape)} for {tuple(phi_q.shape)} and {tuple(phi_k.shape)}")
    return nq.to(phi_q.dtype), nk.to(phi_q.dtype)


@_full_precision
def linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, *, eps: float = 0.0,
                     normalizer: tuple[Tensor, Tensor] | None = None, key_log_scale: Tensor | None = None) -> Tensor:
    """Non-causal linear attention.

    Args:
        phi_q: (B, Lq, H, M) feature-mapped queries.
        phi_k: (B, Lk, H, M) feature-mapped keys.
        v: (B, Lk, H, E) values.
        eps: added to the normaliser (default none: see :func:`normalise`).
        normalizer: optional (queries, keys) features, (B, Lq, H, M') and (B, Lk, H, M'), for
            the denominator only (RoFormer's linear form: rotated features above, positive
            unrotated ones below); default: ``phi_q``, ``phi_k``.
        key_log_scale: (B, Lk, H) a_n, keys' features being φ(k_n) = phi_k_n · e^{a_n} (and
            the normaliser's likewise), from :func:`~spe.ops.feature_maps.favor_key_features`.

    Returns:
        (B, Lq, H, E).
    """
    phi_k, normalizer = _rescale_keys(phi_k, normalizer, key_log_scale)
    if normalizer is None:
        kv = torch.einsum("blhm,blhe->bhme", phi_k, _with_ones(v))
        return _normalised(torch.einsum("blhm,bhme->blhe", phi_q, kv), eps)
    nq, nk = _check_normalizer(normalizer, phi_q, phi_k)
    num = torch.einsum("blhm,bhme->blhe", phi_q, torch.einsum("blhm,blhe->bhme", phi_k, v))
    den = torch.einsum("blhm,bhm->blh", nq, nk.sum(dim=1))[..., None]
    return normalise(num, den, eps)


def _prefix_sums(terms: Tensor, window: int | None) -> Tensor:
    # Σ_{n ≤ m} terms_n along dim 1, or with a window Σ_{m−W < n ≤ m} summed from the single
    # terms over the last W positions (the obvious form, for tests; O(L·W) memory).
    if window is None or window >= terms.shape[1]:
        return torch.cumsum(terms, dim=1)
    padded = torch.cat([torch.zeros_like(terms[:, :window - 1]), terms], dim=1)
    return padded.unfold(1, window, 1).sum(-1)


@_full_precision
def causal_linear_attention_reference(phi_q: Tensor, phi_k: Tensor, v: Tensor, *, eps: float = 0.0,
                                      normalizer: tuple[Tensor, Tensor] | None = None,
                                      window: int | None = None, key_log_scale: Tensor | None = None) -> Tensor:
    """Causal linear attention by cumulative sums; memory O(L·M·E) (O(L·W·M·E) with a window).
    Reference for tests (key scales relative to their overall maximum: use float64).

    Args and returns as :func:`causal_linear_attention`.
    """
    check_window(window)
    phi_k, normalizer = _rescale_keys(phi_k, normalizer, key_log_scale)
    if normalizer is None:
        states = _prefix_sums(torch.einsum("blhm,blhe->blhme", phi_k, _with_ones(v)), window)
        return _normalised(torch.einsum("blhm,blhme->blhe", phi_q, states), eps)
    nq, nk = _check_normalizer(normalizer, phi_q, phi_k)
    num = torch.einsum("blhm,blhme->blhe", phi_q, _prefix_sums(torch.einsum("blhm,blhe->blhme", phi_k, v), window))
    den = torch.einsum("blhm,blhm->blh", nq, _prefix_sums(nk, window))[..., None]
    return normalise(num, den, eps)


@_full_precision
def causal_linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, *, chunk_size: int = 64,
                            group_size: int | None = None, eps: float = 0.0,
                            normalizer: tuple[Tensor, Tensor] | None = None,
                            window: int | None = None, initial_state: LinearAttentionState | None = None,
                            output_final_state: bool = False, key_log_scale: Tensor | None = None) -> Tensor | tuple[Tensor, LinearAttentionState]:
    """Causal linear attention, chunked; never allocates anything of size L × L.

    Inside a chunk of C positions: the masked C × C product. Across chunks: the carried state
    S = Σ φ(k_n)[v_n, 1]ᵀ. With ``group_size``, chunks are processed that many positions at a
    time (the state carried from group to group) so temporaries stay small; by default all
    chunks at once, which measured faster on 2 CPU cores at N = 8,192 and 16,384 (0.85 s vs
    1.03 s and 1.9 s vs 2.6 s forward+backward, batch 2, 8 heads, M = E = 64).
    Memory is O(L·(C + M·E/C)).

    Args:
        phi_q: (B, L, H, M) feature-mapped queries.
        phi_k: (B, L, H, M) feature-mapped keys.
        v: (B, L, H, E) values.
        chunk_size: C, positions per chunk (any positive value; L need not be a multiple).
        group_size: positions per group of chunks (rounded to a multiple of C); None: all.
            Ignored with ``key_log_scale`` (all chunks at once, by a log-depth scan).
        eps: added to the normaliser (default none: see :func:`normalise`).
        normalizer: optional (queries, keys) features for the denominator only, each
            (B, L, H, M'); see :func:`linear_attention`. Costs a second, narrow pass.
        window: W, sliding-window attention: position m attends to n ∈ (m − W, m] only
            (None: all n ≤ m). Any W: the chunks wholly inside the window are summed by
            doubling (sums of 1, 2, 4, … chunks, never a difference of prefix sums, so one
            huge early key cannot wipe out later windows in float32), the at most two chunks
            it cuts get a masked C × C product; the cost is O(L·log(W/C)) and memory stays
            O(L·(C + M·E/C)).
        initial_state: the state after earlier positions (e.g. a prompt, or the previous
            call), as returned with ``output_final_state``; None: start at position 0.
        output_final_state: also return the state after these L positions, from which
            :func:`~spe.ops.recurrent.linear_attention_step` or another call continues.
        key_log_scale: (B, L, H) a_n, keys' features being φ(k_n) = phi_k_n · e^{a_n} (and the
            normaliser's likewise), from :func:`~spe.ops.feature_maps.favor_key_features`:
            sums are then kept relative to the causal running maximum of a (:mod:`spe.ops.scaled`;
            chunk by chunk, so slower), so that no key scale can overflow float32.

    Returns:
        (B, L, H, E), and the :class:`~spe.ops.state.LinearAttentionState` if asked for.

    Raises:
        ValueError: on mismatched lengths, a non-positive chunk size or window, a window
            with ``group_size``, or an initial state of another window or normaliser form.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    check_window(window)
    check_state_window(initial_state, window)
    if window is not None and group_size is not None:
        raise ValueError("causal_linear_attention: a window and group_size cannot be combined")
    n = phi_q.shape[1]
    if phi_k.shape[1] != n or v.shape[1] != n:
        raise ValueError(f"causal linear attention needs equal lengths, got queries {n}, "
                         f"keys {phi_k.shape[1]}, values {v.shape[1]}")
    nq, nk = (None, None) if normalizer is None else _check_normalizer(normalizer, phi_q, phi_k)
    start = 0 if initial_state is None else initial_state.position
    scale, s_scale = None, None
    if (initial_state is not None) and ((initial_state.log_scale is None) != (key_log_scale is None)):
        raise ValueError("the initial state and this call disagree on key_log_scale")
    if key_log_scale is not None and window is not None:
        scale = key_log_scale  # each key relative to its own scale (spe.ops.scaled.scaled_window_sums)
    elif key_log_scale is not None:  # keys relative to the running maximum c_n (spe.ops.scaled)
        s_scale = None if initial_state is None else initial_state.log_scale
        scale = running_max(key_log_scale, s_scale)
        factor = torch.exp(key_log_scale - scale)[..., None]
        phi_k, nk = phi_k * factor, None if nk is None else nk * factor
    if window is not None:
        y, final = _windowed_attention(phi_q, phi_k, v, nq, nk, chunk_size, window, initial_state, eps, scale)
    elif nq is None:
        s0 = None if initial_state is None else torch.cat([initial_state.kv, initial_state.normalizer[..., None]], -1)
        out, s, c = _causal_sums(phi_q, phi_k, _with_ones(v), chunk_size, group_size, s0, scale=scale,
                                 state_scale=s_scale)
        y = _normalised(out, eps)
        final = LinearAttentionState(kv=s[..., :-1], normalizer=s[..., -1], log_scale=c)
    else:
        s0, z0 = (None, None) if initial_state is None else (initial_state.kv, initial_state.normalizer[..., None])
        num, s, c = _causal_sums(phi_q, phi_k, v, chunk_size, group_size, s0, scale=scale, state_scale=s_scale)
        den, z, _ = _causal_sums(nq, nk, torch.ones_like(v[..., :1]), chunk_size, group_size, z0, scale=scale,
                                 state_scale=s_scale)
        y = normalise(num, den, eps)
        final = LinearAttentionState(kv=s, normalizer=z[..., 0], log_scale=c)
    if not output_final_state:
        return y
    final.position, final.window = start + n, window
    return y, final


def _windowed_attention(phi_q, phi_k, v, nq, nk, chunk_size, window, state, eps, scale):
    """The windowed case: earlier keys of ``state`` are prepended (with queries that are then
    dropped), so the first positions see them; the final state keeps the last W keys."""
    r = 0
    if state is not None and state.recent_keys is not None:
        if (state.recent_normalizer_keys is None) != (nq is None):
            raise ValueError("the initial state and this call disagree on a separate normaliser")
        r = state.recent_keys.shape[1]
        phi_q = torch.cat([torch.zeros_like(state.recent_keys[..., :phi_q.shape[-1]]), phi_q], dim=1)
        phi_k = torch.cat([state.recent_keys, phi_k], dim=1)
        v = torch.cat([state.recent_values, v], dim=1)
        if nq is not None:
            nq = torch.cat([torch.zeros_like(state.recent_normalizer_keys), nq], dim=1)
            nk = torch.cat([state.recent_normalizer_keys, nk], dim=1)
        if scale is not None:
            scale = torch.cat([state.recent_log_scales.to(scale), scale], dim=1)
    total = phi_q.shape[1]
    reach = None if window >= total else window  # nothing is ever out of reach
    sk, snk, sums_scale = phi_k, nk, scale
    if scale is not None and reach is None:  # the whole-past sums work relative to the running maximum
        sums_scale = running_max(scale)
        factor = torch.exp(scale - sums_scale)[..., None]
        sk, snk = phi_k * factor, None if nk is None else nk * factor
    if nq is None:
        y = _normalised(_causal_sums(phi_q, sk, _with_ones(v), chunk_size, None, window=reach, scale=sums_scale)[0],
                        eps)
    else:
        num = _causal_sums(phi_q, sk, v, chunk_size, None, window=reach, scale=sums_scale)[0]
        den = _causal_sums(nq, snk, torch.ones_like(v[..., :1]), chunk_size, None, window=reach, scale=sums_scale)[0]
        y = normalise(num, den, eps)
    final = LinearAttentionState(recent_keys=phi_k[:, -window:], recent_values=v[:, -window:],
                                 recent_normalizer_keys=None if nk is None else nk[:, -window:],
                                 log_scale=None if scale is None else scale[:, -window:].amax(dim=1),
                                 recent_log_scales=None if scale is None else scale[:, -window:])
    return y[:, r:], final


def _causal_sums(phi_q: Tensor, phi_k: Tensor, values: Tensor, chunk_size: int, group_size: int | None,
                 state: Tensor | None = None, window: int | None = None, scale: Tensor | None = None,
                 state_scale: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Unnormalised Σ_{n ≤ m} φ(q_m)ᵀφ(k_n) values_n, chunked; (B, L, H, E), the final
    state Σ_n φ(k_n) values_nᵀ (B, H, M, E) (added to ``state``, the sum of earlier keys) and
    its scale (None without ``scale``, the running maximum of :mod:`spe.ops.scaled`).

    With a window (W < L), Σ over m − W < n ≤ m instead, and no state.
    """
    if window is not None:
        if scale is not None:
            return scaled_window_sums(phi_q, phi_k, values, scale, chunk_size, window), None, None
        return _windowed_sums(phi_q, phi_k, values, chunk_size, window), None, None
    if scale is not None:
        return scaled_causal_sums(phi_q, phi_k, values, scale, chunk_size, state, state_scale)
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
    every earlier key, issue 12 defect 2). O(N log whole) work, three (N + whole) arrays.
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


def _windowed_sums(phi_q: Tensor, phi_k: Tensor, values: Tensor, chunk_size: int, window: int) -> Tensor:
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

"""Linear attention kernels (Katharopoulos et al. 2020), causal and not, in O(N) memory.

Letters: B = batch, L = length, H = num_heads, M = feature dimension of φ, E = value dimension.

    y_m = Σ_n φ(q_m)ᵀ φ(k_n) v_n / Σ_n φ(q_m)ᵀ φ(k_n),   n ≤ m when causal.

:func:`causal_linear_attention` is the chunked algorithm (masked C × C products inside a
chunk, a carried state S = Σ φ(k_n) v_nᵀ across chunks); its slow, obviously correct twin
:func:`~spe.ops.linear_attn.naive.causal_linear_attention_reference` uses cumulative sums of
(M × E) outer products, and its recurrent twin
:func:`~spe.ops.linear_attn.recurrent.linear_attention_step` continues from the
state that :func:`causal_linear_attention_with_state` returns (one return type each:
:func:`causal_linear_attention` gives the output only). The chunked sums themselves are in
:mod:`spe.ops.common.chunk` (and :mod:`spe.ops.common.scaled` for keys with log scales).

Every kernel takes a decay on the lag, ``log_decay`` (H,) λ_h = log γ_h (RetNet; causal
weights γ^{m−n}, bidirectional γ^{|m−n|}), whose sums run through :mod:`spe.ops.decay`, or a
data-dependent gate (B, L, H) or (B, L, H, M) (Mamba2, GLA; :mod:`spe.ops.decay.forms`), whose sums
run through :mod:`spe.ops.decay.gated`; the slow twin of both is
:func:`spe.ops.decay.naive.decay_attention_reference`.

The normaliser has no fixed ε (:func:`normalise`); all sums run in at least float32 with
autocast off. ``normalize=False`` gives the numerator alone, Σ_n w_mn φ(q_m)ᵀφ(k_n) v_n
(normaliser-free linear attention: RetNet, GLA, fla's ``linear_attn``), by the same sums:
without key scales every sum is relative to e^0, so it is the absolute numerator.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch
from torch import Tensor

from spe.ops.common.checks import check_window
from spe.ops.common.chunk import causal_sums
from spe.ops.decay.chunk import bidirectional_decay_sums, decayed_running_max
from spe.ops.decay.forms import ChannelGate, ConstantDecay, ScalarGate, decode_decay
from spe.ops.decay.gated import encoder_scalar_chunk, gated_bidirectional_sums, gated_causal_sums
from spe.ops.linear_attn.options import (
    LinearKernelOptions,
    LinearState,
    check_linear_state,
    check_normalize,
    check_normaliser_features,
    check_normalizer,
    constant_log_decay,
    full_precision,
    gate_channels,
    mask_keys,
    normalise,
    normalised,
    rescale_keys,
    to_plain_state,
    to_scaled_state,
    with_ones,
)
from spe.ops.common.scaled import running_max
from spe.ops.common.state import (
    LinearAttentionState,
    RecentKeys,
    ScaledLinearAttentionState,
    ScaledRecentKeys,
)

__all__ = ["causal_linear_attention", "causal_linear_attention_with_state", "chunk_linear_attention",
           "linear_attention", "unchecked_causal_linear_attention_with_state", "unchecked_linear_attention"]


def linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, *,
                     normalizer: tuple[Tensor, Tensor] | None = None, key_log_scale: Tensor | None = None,
                     key_padding_mask: Tensor | None = None, log_decay: Tensor | None = None,
                     chunk_size: int = 64, normalize: bool = True) -> Tensor:
    """Non-causal linear attention.

    Args:
        phi_q: (B, Lq, H, M) feature-mapped queries.
        phi_k: (B, Lk, H, M) feature-mapped keys, or :class:`~spe.ops.common.feature_maps.ScaledFeatures`
            (what :func:`~spe.ops.common.feature_maps.favor_key_features` returns), whose scale is
            then read as ``key_log_scale``.
        v: (B, Lk, H, E) values.
        normalizer: optional (queries, keys) features, (B, Lq, H, M') and (B, Lk, H, M'), for
            the denominator only (RoFormer's linear form: rotated features above, positive
            unrotated ones below); default: ``phi_q``, ``phi_k``.
        key_log_scale: (B, Lk, H) a_n, keys' features being φ(k_n) = phi_k_n · e^{a_n} (and
            the normaliser's likewise); None when ``phi_k`` carries its scale
            (:class:`~spe.ops.common.feature_maps.ScaledFeatures`) or has none.
        key_padding_mask: (B, Lk) bool, True at padding keys (PyTorch's convention): their
            features, values and normaliser features are zeroed, so they add nothing to
            Σ φ(k_n) v_nᵀ or Σ φ(k_n), and their log scale cannot raise the common scale.
        log_decay: (H,) λ = log γ ≤ 0: key n weighs γ^{|m−n|} at query m (the bidirectional
            decay of encoders; positions are the indices, so Lq = Lk), by a forward and a
            backward chunked scan (:func:`spe.ops.decay.bidirectional_decay_sums`). Or a gate
            (B, L, H) or (B, L, H, M): key n weighs exp(Σ_{min(m,n)<t≤max(m,n)} G_t), the gates
            of the positions between them, the later one's included (e^{G_t} separates t − 1
            from t in both directions; :func:`spe.ops.decay.gated.gated_bidirectional_sums`).
            None: none.
        chunk_size: C of those scans (unused without a decay; a scalar gate's at most C,
            :func:`spe.ops.decay.gated.encoder_scalar_chunk`).
        normalize: divide by the normaliser; False: the numerator Σ_n w_mn φ(q_m)ᵀφ(k_n) v_n
            alone (normaliser-free linear attention, fla's ``normalize=False``; no
            ``normalizer`` or ``key_log_scale``).

    Returns:
        (B, Lq, H, E).

    Raises:
        ValueError: on a bad padding mask or normaliser, a bad ``log_decay`` (or a channel
            gate with key scales), a decay with Lq ≠ Lk, ``normalize=False`` with a
            normaliser or key scales, or ``phi_k`` as ScaledFeatures with a
            ``key_log_scale`` too; with ``normalize=True``, on negative normaliser features
            (:func:`check_normaliser_features`: SPE's signed q̂, k̂ need a feature map first).
    """
    check_normaliser_features(phi_q, phi_k, normalizer, normalize, "linear_attention")
    return unchecked_linear_attention(phi_q, phi_k, v, normalizer=normalizer, key_log_scale=key_log_scale,
                                      key_padding_mask=key_padding_mask, log_decay=log_decay,
                                      chunk_size=chunk_size, normalize=normalize)


@full_precision
def unchecked_linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, *,
                               normalizer: tuple[Tensor, Tensor] | None = None, key_log_scale: Tensor | None = None,
                               key_padding_mask: Tensor | None = None, log_decay: Tensor | None = None,
                               chunk_size: int = 64, normalize: bool = True) -> Tensor:
    """:func:`linear_attention` without the normaliser's value check (a device sync on CUDA):
    for callers whose features are non-negative by construction (the layer's kernels)."""
    normalize = check_normalize(normalize, normalizer, key_log_scale)
    if phi_q.shape[1] == 0 or phi_k.shape[1] == 0:  # no query, or no key to weigh: zeros
        return v.new_zeros(*phi_q.shape[:3], v.shape[-1])
    if key_padding_mask is not None:
        phi_k, v, normalizer, key_log_scale = mask_keys(key_padding_mask, phi_k, v, normalizer, key_log_scale)
    if log_decay is not None:
        decay = decode_decay(log_decay, phi_q.shape, key_log_scale=key_log_scale is not None,
                             normalizer_features=None if normalizer is None else normalizer[0].shape[-1])
        opts = LinearKernelOptions(chunk_size=chunk_size, normalize=normalize, key_log_scale=key_log_scale,
                                   decay=decay)
        return _bidirectional_decay(phi_q, phi_k, v, normalizer, opts)
    phi_k, normalizer = rescale_keys(phi_k, normalizer, key_log_scale)
    if normalizer is None:
        kv = torch.einsum("blhm,blhe->bhme", phi_k, with_ones(v))
        return normalised(torch.einsum("blhm,bhme->blhe", phi_q, kv), normalize)
    nq, nk = check_normalizer(normalizer, phi_q, phi_k)
    num = torch.einsum("blhm,bhme->blhe", phi_q, torch.einsum("blhm,blhe->bhme", phi_k, v))
    den = torch.einsum("blhm,bhm->blh", nq, nk.sum(dim=1))[..., None]
    return normalise(num, den)


def _bidirectional_decay(phi_q: Tensor, phi_k: Tensor, v: Tensor, normalizer, opts: LinearKernelOptions) -> Tensor:
    """:func:`linear_attention` with a decay γ^{|m−n|} or a gate (keys already masked; the decay
    decoded in ``opts``)."""
    decay, chunk_size = opts.decay, opts.chunk_size
    if isinstance(decay, ConstantDecay):
        sums, log_decay = bidirectional_decay_sums, decay.log_decay
    else:
        sums, log_decay = gated_bidirectional_sums, decay.gates
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if phi_k.shape[1] != phi_q.shape[1]:
        raise ValueError(f"a decay needs as many queries as keys (one position each), got {phi_q.shape[1]} "
                         f"and {phi_k.shape[1]}")
    a = phi_k.new_zeros(phi_k.shape[:3]) if opts.key_log_scale is None else opts.key_log_scale
    if isinstance(decay, ScalarGate):  # the exact in-chunk form: C from the cost
        chunk_size = encoder_scalar_chunk(phi_q.shape[1], phi_q.shape[-1], v.shape[-1] + (normalizer is None),
                                          chunk_size)
    if normalizer is None:
        return normalised(sums(phi_q, phi_k, with_ones(v), a, log_decay, chunk_size)[0], opts.normalize)
    nq, nk = check_normalizer(normalizer, phi_q, phi_k)
    num = sums(phi_q, phi_k, v, a, log_decay, chunk_size)[0]
    den = sums(nq, nk, torch.ones_like(v[..., :1]), a, log_decay, chunk_size)[0]
    return normalise(num, den)  # both relative to the same scale (it depends on a and the decay only)

def causal_linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, *, chunk_size: int = 64,
                            group_size: int | None = None,
                            normalizer: tuple[Tensor, Tensor] | None = None, window: int | None = None,
                            initial_state: LinearState | None = None, key_log_scale: Tensor | None = None,
                            log_decay: Tensor | None = None,
                            normalize: bool = True) -> Tensor:
    """Causal linear attention, chunked; never allocates anything of size L × L.

    Inside a chunk of C positions: the masked C × C product. Across chunks: the carried state
    S = Σ φ(k_n)[v_n, 1]ᵀ. With ``group_size``, chunks are processed that many positions at a
    time (the state carried from group to group) so temporaries stay small; by default all
    chunks at once, which measured faster on 2 CPU cores at N = 8,192 and 16,384 (0.85 s vs
    1.03 s and 1.9 s vs 2.6 s forward+backward, batch 2, 8 heads, M = E = 64).
    Memory is O(L·(C + M·E/C)).

    Args:
        phi_q: (B, L, H, M) feature-mapped queries.
        phi_k: (B, L, H, M) feature-mapped keys, or :class:`~spe.ops.common.feature_maps.ScaledFeatures`
            (what :func:`~spe.ops.common.feature_maps.favor_key_features` returns), whose scale is
            then read as ``key_log_scale``.
        v: (B, L, H, E) values.
        chunk_size: C, positions per chunk (any positive value; L need not be a multiple).
        group_size: positions per group of chunks (rounded to a multiple of C); None: all.
            Ignored with ``key_log_scale`` (all chunks at once, by a log-depth scan).
        normalizer: optional (queries, keys) features for the denominator only, each
            (B, L, H, M'); see :func:`linear_attention`. Costs a second, narrow pass.
        window: W, sliding-window attention: position m attends to n ∈ (m − W, m] only
            (None: all n ≤ m). Any W: the chunks wholly inside the window are summed by
            doubling (sums of 1, 2, 4, … chunks, never a difference of prefix sums, so one
            huge early key cannot wipe out later windows in float32), the at most two chunks
            it cuts get a masked C × C product; the cost is O(L·log(W/C)) and memory stays
            O(L·(C + M·E/C)).
        initial_state: the state after earlier positions (e.g. a prompt, or the previous
            call), as returned by :func:`causal_linear_attention_with_state`; None: start at
            position 0. Its type must fit the call: :class:`~spe.ops.common.state.RecentKeys` with a
            window, :class:`~spe.ops.common.state.LinearAttentionState` without, their ``Scaled``
            subclasses with ``key_log_scale``.
        key_log_scale: (B, L, H) a_n, keys' features being φ(k_n) = phi_k_n · e^{a_n} (and the
            normaliser's likewise; None when ``phi_k`` is
            :class:`~spe.ops.common.feature_maps.ScaledFeatures`, which carries it):
            sums are then kept relative to the causal running maximum of a (:mod:`spe.ops.common.scaled`;
            chunk by chunk, so slower), so that no key scale can overflow float32.
        log_decay: (H,) λ_h = log γ_h ≤ 0, RetNet's decay: key n weighs γ^{m−n} at query m,
            in numerator and normaliser alike (:mod:`spe.ops.decay`; inside a chunk the mask
            γ^{j−d}, across chunks the state times γ^C, read with γ^{j+1}; never γ to an
            absolute position). Runs through the scaled sums (zero log scales without
            ``key_log_scale``; ``group_size`` is then ignored). The initial state must come
            from a call with the same decay (states do not record it). Or a data-dependent gate
            (:mod:`spe.ops.decay.forms`), G_t ≤ 0 the log of the factor by which position t
            multiplies the state carried from t − 1, so that key n weighs
            exp(Σ_{n<t≤m} G_t) at query m: (B, L, H), one per head and position (Mamba2,
            simple GLA), or (B, L, H, M), one per feature channel of φ (GLA; not with
            ``key_log_scale``; a separate normaliser must have M features too). Chunked in
            log space (:mod:`spe.ops.decay.gated`: segment sums inside a chunk, chunks carried by
            doubling; a channel gate's chunks are at most 16 long; ``group_size`` is ignored);
            an initial state continues exactly (a windowed one keeps the kept positions'
            gates). None: no decay.
        normalize: divide by the normaliser; False: the numerator Σ_n w_mn φ(q_m)ᵀφ(k_n) v_n
            alone (normaliser-free linear attention, fla's ``normalize=False``; no
            ``normalizer`` or ``key_log_scale``); the state keeps its form. On SPE's q̂, k̂
            the numerator is √(R/D) times Σ_n w_mn Σ_d q_d k_d P_d(m − n) v_n in expectation
            (:mod:`spe.attention.kernels`, ``linear``).

    Returns:
        (B, L, H, E) in ``v``'s dtype (:func:`causal_linear_attention_with_state` also gives
            the final state).

    Raises:
        ValueError: on mismatched lengths, a non-positive chunk size or window, a window
            with ``group_size``, a bad ``log_decay`` (shape, dtype, a value > 0 or not finite,
            a channel gate with key scales), an initial state of another window,
            normaliser, key-scale or gate form, ``normalize=False`` with a normaliser,
            key scales, or ``phi_k`` as ScaledFeatures with a ``key_log_scale`` too; with
            ``normalize=True``, on negative normaliser features
            (:func:`check_normaliser_features`: SPE's signed q̂, k̂ need a feature map first,
            e.g. ``spe.ops.elu_feature_map``, or ``normalize=False``).
        TypeError: on an initial state that is not a linear-attention state.
    """
    check_normaliser_features(phi_q, phi_k, normalizer, normalize, "causal_linear_attention")
    if phi_q.shape[1] == 0 and initial_state is None:  # no position: nothing to carry either
        return v.new_zeros(v.shape)
    return _causal_linear(phi_q, phi_k, v, chunk_size=chunk_size, group_size=group_size,
                          normalizer=normalizer, window=window, initial_state=initial_state,
                          key_log_scale=key_log_scale, log_decay=log_decay, normalize=normalize)[0]


def causal_linear_attention_with_state(phi_q: Tensor, phi_k: Tensor, v: Tensor, *, chunk_size: int = 64,
                                       group_size: int | None = None,
                                       normalizer: tuple[Tensor, Tensor] | None = None, window: int | None = None,
                                       initial_state: LinearState | None = None,
                                       key_log_scale: Tensor | None = None, log_decay: Tensor | None = None,
                                       normalize: bool = True) -> tuple[Tensor, LinearState]:
    """:func:`causal_linear_attention` that also returns the state after these L positions
    (flash-linear-attention's ``output_final_state``).

    Args and raises as :func:`causal_linear_attention`.

    Returns:
        (B, L, H, E) output in ``v``'s dtype, and the final state (in the kernel's dtype, at
        least float32): :class:`~spe.ops.common.state.LinearAttentionState` (whole past) or
        :class:`~spe.ops.common.state.RecentKeys` (window), their ``Scaled`` subclasses with
        ``key_log_scale``; :func:`~spe.ops.linear_attn.linear_attention_step` or another call
        continues from it.
    """
    check_normaliser_features(phi_q, phi_k, normalizer, normalize, "causal_linear_attention_with_state")
    return unchecked_causal_linear_attention_with_state(
        phi_q, phi_k, v, chunk_size=chunk_size, group_size=group_size, normalizer=normalizer, window=window,
        initial_state=initial_state, key_log_scale=key_log_scale, log_decay=log_decay, normalize=normalize)


def unchecked_causal_linear_attention_with_state(phi_q: Tensor, phi_k: Tensor, v: Tensor, *, chunk_size: int = 64,
                                                 group_size: int | None = None, normalizer=None,
                                                 window: int | None = None, initial_state: LinearState | None = None,
                                                 key_log_scale: Tensor | None = None, log_decay: Tensor | None = None,
                                                 normalize: bool = True) -> tuple[Tensor, LinearState]:
    """:func:`causal_linear_attention_with_state` without the normaliser's value check (a
    device sync on CUDA): for callers whose features are non-negative by construction."""
    return _causal_linear(phi_q, phi_k, v, chunk_size=chunk_size, group_size=group_size,
                          normalizer=normalizer, window=window, initial_state=initial_state,
                          key_log_scale=key_log_scale, log_decay=log_decay, normalize=normalize)


@full_precision
def _causal_linear(phi_q: Tensor, phi_k: Tensor, v: Tensor, *, chunk_size: int, group_size: int | None,
                   normalizer, window: int | None, initial_state: LinearState | None,
                   key_log_scale: Tensor | None, log_decay: Tensor | None = None,
                   normalize: bool = True) -> tuple[Tensor, LinearState]:
    """The public causal kernels' checks and decoding, once: then :func:`chunk_linear_attention`."""
    normalize = check_normalize(normalize, normalizer, key_log_scale)
    if phi_q.shape[1] == 0:
        if initial_state is None:
            raise ValueError(f"causal linear attention of length 0 (phi_q {tuple(phi_q.shape)}) has no final state: "
                             "give at least one position, or an initial_state to pass on")
        return v.new_zeros(v.shape), initial_state
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    check_window(window)
    decay = decode_decay(log_decay, phi_q.shape, key_log_scale=key_log_scale is not None,
                         normalizer_features=None if normalizer is None else normalizer[0].shape[-1])
    check_linear_state(initial_state, window=window, scaled=key_log_scale is not None,
                       gate_channels=gate_channels(decay))
    if window is not None and group_size is not None:
        raise ValueError("causal_linear_attention: a window and group_size cannot be combined")
    n = phi_q.shape[1]
    if phi_k.shape[1] != n or v.shape[1] != n:
        raise ValueError(f"causal linear attention needs equal lengths, got queries {n}, "
                         f"keys {phi_k.shape[1]}, values {v.shape[1]}")
    normalizer = None if normalizer is None else check_normalizer(normalizer, phi_q, phi_k)
    position = n + (0 if initial_state is None else initial_state.position)
    opts = LinearKernelOptions(chunk_size=chunk_size, window=window, normalize=normalize, key_log_scale=key_log_scale,
                               position=position, decay=decay, group_size=group_size)
    return chunk_linear_attention(phi_q, phi_k, v, normalizer, initial_state, opts)


def chunk_linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, normalizer: tuple[Tensor, Tensor] | None,
                           state: LinearState | None, opts: LinearKernelOptions) -> tuple[Tensor, LinearState]:
    """Causal linear attention, chunked, from checked inputs: (o, final_state).

    The signature of :func:`spe.ops.linear_attn.recurrent.recurrent_linear_attention` (its
    one-position twin). Inputs in the kernel's dtype with autocast off; the decay decoded.

    Args:
        phi_q, phi_k: (B, L, H, M); v: (B, L, H, E); normalizer: (ψ(q), ψ(k)) (B, L, H, M') or
            None; state: the state before these positions, or None; opts: the options record.

    Returns:
        (B, L, H, E) and the state after them.
    """
    if isinstance(opts.decay, (ScalarGate, ChannelGate)):
        return _gated_causal(phi_q, phi_k, v, normalizer, state, opts)
    if isinstance(opts.decay, ConstantDecay):
        return _decayed_causal(phi_q, phi_k, v, normalizer, state, opts)
    if opts.window is not None:  # each key relative to its own scale (spe.ops.common.scaled.scaled_window_sums)
        return _windowed_attention(phi_q, phi_k, v, normalizer, state, opts)
    return _whole_past_attention(phi_q, phi_k, v, normalizer, state, opts)


def _decayed_causal(phi_q: Tensor, phi_k: Tensor, v: Tensor, normalizer, state: LinearState | None,
                    opts: LinearKernelOptions) -> tuple[Tensor, LinearState]:
    """The causal cases with a constant decay: keys without log scales get zero ones (the decayed
    running maximum of zeros is exactly 0), so that one algorithm, :mod:`spe.ops.common.scaled`'s,
    serves both; plain states are converted on the way in and out."""
    plain = opts.key_log_scale is None
    if plain:
        opts = replace(opts, key_log_scale=phi_k.new_zeros(phi_k.shape[:3]))
        state = None if state is None else to_scaled_state(state)
    if opts.window is not None:
        y, state = _windowed_attention(phi_q, phi_k, v, normalizer, state, opts)
    else:
        y, state = _whole_past_attention(phi_q, phi_k, v, normalizer, state, replace(opts, group_size=None))
    return y, (to_plain_state(state) if plain else state)


def _whole_past_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, normalizer, state: LinearState | None,
                          opts: LinearKernelOptions) -> tuple[Tensor, LinearState]:
    """The case without a window: the chunked sums continue ``state``'s running sums (relative
    to the running maximum c_n of the key scales, :mod:`spe.ops.common.scaled`, if any; the decayed
    one with a constant decay)."""
    key_log_scale, log_decay = opts.key_log_scale, constant_log_decay(opts.decay)
    nq, nk = (None, None) if normalizer is None else normalizer
    scale, s_scale = None, None
    if key_log_scale is not None:
        s_scale = None if state is None else state.log_scale
        scale = (running_max(key_log_scale, s_scale) if log_decay is None
                 else decayed_running_max(key_log_scale, log_decay.detach(), s_scale))
        factor = torch.exp(key_log_scale - scale)[..., None]
        phi_k, nk = phi_k * factor, None if nk is None else nk * factor
    sums = functools.partial(causal_sums, chunk_size=opts.chunk_size, group_size=opts.group_size, scale=scale,
                             state_scale=s_scale, log_decay=log_decay)
    if nq is None:
        s0 = None if state is None else torch.cat([state.kv, state.normalizer[..., None]], -1)
        out, s, c = sums(phi_q, phi_k, with_ones(v), state=s0)
        y, kv, z = normalised(out, opts.normalize), s[..., :-1], s[..., -1]
    else:
        s0, z0 = (None, None) if state is None else (state.kv, state.normalizer[..., None])
        num, kv, c = sums(phi_q, phi_k, v, state=s0)
        den, z, _ = sums(nq, nk, torch.ones_like(v[..., :1]), state=z0)
        y, z = normalise(num, den), z[..., 0]
    if c is None:
        return y, LinearAttentionState(kv=kv, normalizer=z, position=opts.position)
    return y, ScaledLinearAttentionState(kv=kv, normalizer=z, position=opts.position, log_scale=c)


def _windowed_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, normalizer, state: RecentKeys | None,
                        opts: LinearKernelOptions) -> tuple[Tensor, RecentKeys]:
    """The windowed case: earlier keys of ``state`` are prepended (with queries that are then
    dropped), so the first positions see them (positions stay contiguous, so a decay's lags
    hold); the final state keeps the last W keys."""
    log_decay = constant_log_decay(opts.decay)
    nq, nk = (None, None) if normalizer is None else normalizer
    r, phi_q, phi_k, v, nq, nk, scale, _ = _prepend_recent(state, phi_q=phi_q, phi_k=phi_k, v=v, nq=nq, nk=nk,
                                                           scale=opts.key_log_scale)
    total = phi_q.shape[1]
    reach = None if opts.window >= total else opts.window  # nothing is ever out of reach
    sk, snk, sums_scale = phi_k, nk, scale
    if scale is not None and reach is None:  # the whole-past sums work relative to the running maximum
        sums_scale = running_max(scale) if log_decay is None else decayed_running_max(scale, log_decay.detach())
        factor = torch.exp(scale - sums_scale)[..., None]
        sk, snk = phi_k * factor, None if nk is None else nk * factor
    sums = functools.partial(causal_sums, chunk_size=opts.chunk_size, group_size=None, window=reach,
                             scale=sums_scale, log_decay=log_decay)
    if nq is None:
        y = normalised(sums(phi_q, sk, with_ones(v))[0], opts.normalize)
    else:
        num = sums(phi_q, sk, v)[0]
        den = sums(nq, snk, torch.ones_like(v[..., :1]))[0]
        y = normalise(num, den)
    return y[:, r:], _recent_keys(phi_k, v, nk, scale, opts)


def _prepend_recent(state: RecentKeys | None, *, phi_q, phi_k, v, nq, nk, scale, gates=None):
    """The kept keys of a windowed state (values, normaliser features, log scales, gates) put
    before this call's, with zero queries: (their number, then the tensors, longer by it)."""
    if state is None:
        return 0, phi_q, phi_k, v, nq, nk, scale, gates
    if (state.normalizer_keys is None) != (nq is None):
        raise ValueError("the initial state and this call disagree on a separate normaliser")
    phi_q = torch.cat([torch.zeros_like(state.keys[..., :phi_q.shape[-1]]), phi_q], dim=1)
    phi_k = torch.cat([state.keys, phi_k], dim=1)
    v = torch.cat([state.values, v], dim=1)
    if nq is not None:
        nq = torch.cat([torch.zeros_like(state.normalizer_keys), nq], dim=1)
        nk = torch.cat([state.normalizer_keys, nk], dim=1)
    if scale is not None:
        scale = torch.cat([state.log_scales.to(scale), scale], dim=1)
    if gates is not None:
        gates = torch.cat([state.log_gates.to(gates), gates], dim=1)
    return state.keys.shape[1], phi_q, phi_k, v, nq, nk, scale, gates


def _recent_keys(phi_k: Tensor, v: Tensor, nk: Tensor | None, scale: Tensor | None, opts: LinearKernelOptions, *,
                 gates: Tensor | None = None) -> RecentKeys:
    """The windowed state after these keys: the last W (with their log scales and gates, if any)."""
    window = opts.window
    kept = {"keys": phi_k[:, -window:], "values": v[:, -window:], "window": window, "position": opts.position,
            "normalizer_keys": None if nk is None else nk[:, -window:],
            "log_gates": None if gates is None else gates[:, -window:]}
    if scale is None:
        return RecentKeys(**kept)
    return ScaledRecentKeys(**kept, log_scales=scale[:, -window:])


def _gated_causal(phi_q: Tensor, phi_k: Tensor, v: Tensor, normalizer, state: LinearState | None,
                  opts: LinearKernelOptions) -> tuple[Tensor, LinearState]:
    """The causal cases with a gate (B, L, H, G) (:mod:`spe.ops.decay.gated`): keys without log
    scales get zero ones; a windowed state's kept keys come first, with their gates (as in
    :func:`_windowed_attention`); a whole-past state is the sums' initial state."""
    key_log_scale, window, gates = opts.key_log_scale, opts.window, opts.decay.gates
    nq, nk = (None, None) if normalizer is None else normalizer
    a, s0, z0, c0, r = key_log_scale, None, None, None, 0
    if window is not None:
        r, phi_q, phi_k, v, nq, nk, a, gates = _prepend_recent(state, phi_q=phi_q, phi_k=phi_k, v=v, nq=nq, nk=nk,
                                                               scale=a, gates=gates)
    elif state is not None:
        s0, z0 = state.kv, state.normalizer[..., None]
        c0 = state.log_scale if key_log_scale is not None else z0.new_zeros(z0.shape[:2])
    a = phi_k.new_zeros(phi_k.shape[:3]) if a is None else a
    reach = None if window is None or window >= phi_q.shape[1] else window
    sums = functools.partial(gated_causal_sums, gates=gates, log_scale=a, chunk_size=opts.chunk_size, window=reach,
                             state_scale=c0)
    if nq is None:
        out, _, s, c = sums(phi_q, phi_k, with_ones(v), state=None if s0 is None else torch.cat([s0, z0], -1))
        y = normalised(out, opts.normalize)
        kv, z = (None, None) if s is None else (s[..., :-1], s[..., -1])
    else:
        num, _, kv, c = sums(phi_q, phi_k, v, state=s0)
        den, _, z, _ = sums(nq, nk, torch.ones_like(v[..., :1]), state=z0)
        y, z = normalise(num, den), None if z is None else z[..., 0]
    if window is not None:
        return y[:, r:], _recent_keys(phi_k, v, nk, None if key_log_scale is None else a, opts, gates=gates)
    if key_log_scale is not None:
        return y, ScaledLinearAttentionState(kv=kv, normalizer=z, position=opts.position, log_scale=c)
    absolute = torch.exp(c)  # 1: the decayed running maximum of zero scales is 0
    return y, LinearAttentionState(kv=kv * absolute[..., None, None], normalizer=z * absolute[..., None],
                                   position=opts.position)

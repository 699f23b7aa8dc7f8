"""The recurrent twin of causal linear attention: one decoding step from a typed state.

Letters: B = batch, H = num_heads, M = feature dimension of φ (M' of a separate normaliser),
E = value dimension, W = window.

:func:`linear_attention_step` equals :func:`~spe.ops.linear_attn.chunk.causal_linear_attention`
at that position (plain, with RoPE's separate normaliser, windowed, with a constant decay or a
gate; tests compare outputs and final states, forward and backward), and
:func:`recurrent_linear_attention` shares :func:`~spe.ops.linear_attn.chunk.chunk_linear_attention`'s
signature. Sums are kept in at least float32 with autocast off, as in the parallel kernels.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.common.checks import check_one_position, check_window
from spe.ops.decay.forms import ChannelGate, ConstantDecay, Decay, ScalarGate, decode_decay
from spe.ops.common.feature_maps import ScaledFeatures, split_key_features
from spe.ops.decay.sums import suffix_sums
from spe.ops.linear_attn.options import (
    LinearKernelOptions,
    LinearState,
    check_linear_state,
    check_normalize,
    check_normaliser_features,
    constant_log_decay,
    gate_channels,
    kernel_dtype,
    normalise,
)
from spe.ops.common.state import (
    LinearAttentionState,
    RecentKeys,
    ScaledLinearAttentionState,
    ScaledRecentKeys,
)

__all__ = ["linear_attention_step", "recurrent_linear_attention",
           "unchecked_linear_attention_step"]


def linear_attention_step(phi_q: Tensor, phi_k: Tensor | ScaledFeatures, v: Tensor,
                          state: LinearState | None = None, *,
                          normalizer: tuple[Tensor, Tensor] | None = None, window: int | None = None,
                          key_log_scale: Tensor | None = None, log_decay: Tensor | None = None,
                          normalize: bool = True) -> tuple[Tensor, LinearState]:
    """One causal linear-attention step: y = φ(q)ᵀ S / ψ(q)ᵀ z with S, z updated by this key.

    Whole past: S ← S + φ(k) vᵀ, z ← z + ψ(k), O(M·E) per step at any position
    (:class:`~spe.ops.common.state.LinearAttentionState`). Window W: the last W keys and values are
    kept and the sums re-formed from them, O(W·M·E) (:class:`~spe.ops.common.state.RecentKeys`). With
    ``key_log_scale`` the state is kept relative to the running maximum c of the keys' log
    scales (S ← S e^{c_old − c} + …), as the chunked kernel does (:mod:`spe.ops.common.scaled`), in the
    ``Scaled`` subclasses.

    Args:
        phi_q: (B, 1, H, M) feature-mapped query of the new position.
        phi_k: (B, 1, H, M) its key features, or :class:`~spe.ops.common.feature_maps.ScaledFeatures`
            (FAVOR+: ``favor_key_features(k, projection)``), whose scale is read as ``key_log_scale``.
        v: (B, 1, H, E) its value.
        state: from the previous step or from
            :func:`~spe.ops.linear_attn.chunk.causal_linear_attention_with_state`; None at position 0.
        normalizer: optional (query, key) features (B, 1, H, M') for the denominator only
            (RoPE: ``phi_q``, ``phi_k`` rotated, these unrotated).
        window: W, or None for the whole past; must match the state's.
        key_log_scale: (B, 1, H) a, the key's features being phi_k · e^a (FAVOR+); None when
            ``phi_k`` carries it.
        log_decay: (H,) λ = log γ (RetNet): S ← γ S + φ(k) vᵀ, z ← γ z + ψ(k) (with key
            scales: the state's log scale c + λ, then c ← max(c + λ, a)); with a window the
            kept keys weigh γ^{lag}. Must be the decay the state was built with. Or this
            position's gate (:mod:`spe.ops.decay.forms`): (B, 1, H) G, S ← e^G S + φ(k) vᵀ (c ← max(c
            + G, a) with key scales), or (B, 1, H, M) per feature channel, S ← diag(e^G) S + …;
            with a window the state keeps the kept positions' gates.
        normalize: divide by the normaliser; False: y = φ(q)ᵀ S alone (normaliser-free, as
            :func:`~spe.ops.linear_attn.chunk.causal_linear_attention`'s; no ``normalizer`` or
            ``key_log_scale``); the state keeps its form.

    Returns:
        (B, 1, H, E) output in ``v``'s dtype, and the new state (position + 1).

    Raises:
        ValueError: on more than one position, a bad ``log_decay``, a state of another
            window, normaliser, key-scale or gate form, ``normalize=False`` with a
            normaliser or key scales, or ScaledFeatures with a ``key_log_scale`` too.
        TypeError: on a state that is not a linear-attention state.
    """
    check_normaliser_features(phi_q, phi_k, normalizer, normalize, "linear_attention_step")
    return unchecked_linear_attention_step(phi_q, phi_k, v, state, normalizer=normalizer, window=window,
                                           key_log_scale=key_log_scale, log_decay=log_decay, normalize=normalize)


def unchecked_linear_attention_step(phi_q: Tensor, phi_k: Tensor | ScaledFeatures, v: Tensor,
                                    state: LinearState | None = None, *,
                                    normalizer: tuple[Tensor, Tensor] | None = None, window: int | None = None,
                                    key_log_scale: Tensor | None = None, log_decay: Tensor | None = None,
                                    normalize: bool = True) -> tuple[Tensor, LinearState]:
    """:func:`linear_attention_step` without the normaliser's value check (a device sync on
    CUDA): for callers whose features are non-negative by construction (the layer's kernels)."""
    phi_k, key_log_scale = split_key_features(phi_k, key_log_scale, who="linear_attention_step")
    check_one_position(phi_q=phi_q, phi_k=phi_k, v=v)
    normalized = check_normalize(normalize, normalizer, key_log_scale)
    decay = decode_decay(log_decay, phi_q.shape, key_log_scale=key_log_scale is not None,
                         normalizer_features=None if normalizer is None else normalizer[0].shape[-1])
    check_window(window)
    check_linear_state(state, window=window, scaled=key_log_scale is not None, who="decoding state",
                       gate_channels=gate_channels(decay))
    dtype = kernel_dtype(phi_q, v)
    position = 1 + (0 if state is None else state.position)
    with torch.autocast(device_type=v.device.type, enabled=False):
        fq, fk, vf = phi_q.to(dtype), phi_k.to(dtype), v.to(dtype)
        normalizer = None if normalizer is None else tuple(t.to(dtype) for t in normalizer)
        state = None if state is None else state.to(dtype)
        opts = LinearKernelOptions(window=window, normalize=normalized, position=position,
                                   decay=_decay_to(decay, dtype),
                                   key_log_scale=None if key_log_scale is None else key_log_scale.to(dtype))
        y, new = recurrent_linear_attention(fq, fk, vf, normalizer, state, opts)
    return y.to(v.dtype), new


def _decay_to(decay: Decay | None, dtype: torch.dtype) -> Decay | None:
    if decay is None:
        return None
    if isinstance(decay, ConstantDecay):
        return ConstantDecay(decay.log_decay.to(dtype))
    return type(decay)(decay.gates.to(dtype))


def recurrent_linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, normalizer: tuple[Tensor, Tensor] | None,
                               state: LinearState | None, opts: LinearKernelOptions) -> tuple[Tensor, LinearState]:
    """One causal step from checked inputs: (o, new state); the signature of
    :func:`spe.ops.linear_attn.chunk.chunk_linear_attention` for L = 1.

    Args:
        phi_q, phi_k: (B, 1, H, M); v: (B, 1, H, E); normalizer: (ψ(q), ψ(k)) (B, 1, H, M') or
            None; state: the state before this position, or None; opts: the options record
            (``key_log_scale`` (B, 1, H), ``position`` the new state's; no chunk).

    Returns:
        (B, 1, H, E) and the state after this position.
    """
    nq, nk = (phi_q, phi_k) if normalizer is None else normalizer
    a = None if opts.key_log_scale is None else opts.key_log_scale[:, 0]  # (B, H)
    if opts.window is None:
        kv, z, new = _sums_step(state, phi_k, v, nk, a, opts)
    else:
        kv, z, new = _window_step(state, phi_k, v, None if normalizer is None else nk, a, opts)
    y = torch.einsum("blhm,bhme->blhe", phi_q, kv)
    if opts.normalize:
        y = normalise(y, torch.einsum("blhm,bhm->blh", nq, z)[..., None])
    return y, new


def _sums_step(state: LinearAttentionState | None, fk: Tensor, vf: Tensor, nk: Tensor, a: Tensor | None,
               opts: LinearKernelOptions) -> tuple[Tensor, Tensor, LinearAttentionState]:
    """Running sums with one more key: (S, z, the new state); the decay as ``lam``: (H,) log γ, a
    gate (B, H) or a channel gate (B, H, M) (without key scales), or None."""
    position, decay, lam = opts.position, opts.decay, constant_log_decay(opts.decay)
    if isinstance(decay, ScalarGate):
        lam = decay.gates[:, 0, :, 0]
    elif isinstance(decay, ChannelGate):
        lam = decay.gates[:, 0]
    per_channel = isinstance(decay, ChannelGate)  # never with key scales (decode_decay refuses it)
    decay = None
    if a is not None:  # relative to the running maximum of the key scales
        if lam is None:
            scale = a if state is None else torch.maximum(state.log_scale, a)
            decay = None if state is None else torch.exp(state.log_scale - scale)
        else:  # a decay shifts the old sums' log scale by λ (spe.ops.decay); the scale is a reference only
            scale = a if state is None else torch.maximum(state.log_scale + lam.detach(), a)
            decay = None if state is None else torch.exp(state.log_scale + lam - scale)
        factor = torch.exp(a - scale)[:, None, :, None]
        fk, nk = fk * factor, nk * factor
    elif lam is not None and state is not None:  # S ← γ S
        decay = torch.exp(lam).expand(state.normalizer.shape[:3 if per_channel else 2])  # (B, H, M) or (B, H)
    kv, z = torch.einsum("blhm,blhe->bhme", fk, vf), nk[:, 0]
    if state is not None:
        old_kv, old_z = state.kv, state.normalizer
        if decay is not None and per_channel:  # diag(e^G) S
            old_kv, old_z = old_kv * decay[..., None], old_z * decay
        elif decay is not None:
            old_kv, old_z = old_kv * decay[..., None, None], old_z * decay[..., None]
        kv, z = old_kv + kv, old_z + z
    if a is None:
        return kv, z, LinearAttentionState(kv=kv, normalizer=z, position=position)
    return kv, z, ScaledLinearAttentionState(kv=kv, normalizer=z, position=position, log_scale=scale)


def _window_step(state: RecentKeys | None, fk: Tensor, vf: Tensor, nk: Tensor | None, a: Tensor | None,
                 opts: LinearKernelOptions) -> tuple[Tensor, Tensor, RecentKeys]:
    """The last W keys with this one (each relative to its own scale), and the sums they form:
    (S, z, the new state); ``nk`` None: no separate normaliser; a constant decay λ (H,): the kept
    key t of T weighs γ^{T−1−t}; a gate (B, 1, H, G), this position's: kept with the keys, key t
    weighs exp(Σ_{t<s<T} G_s)."""
    window, position, lam = opts.window, opts.position, constant_log_decay(opts.decay)
    gates = opts.decay.gates if gate_channels(opts.decay) else None  # (B, 1, H, G)
    if state is not None and (state.normalizer_keys is None) != (nk is None):
        raise ValueError("the decoding state and this step disagree on a separate normaliser")

    def append(old: Tensor | None, new: Tensor | None) -> Tensor | None:
        return new if old is None or new is None else torch.cat([old, new], dim=1)[:, -window:]

    kept = {"keys": append(None if state is None else state.keys, fk),
            "values": append(None if state is None else state.values, vf),
            "normalizer_keys": append(None if state is None else state.normalizer_keys, nk),
            "log_gates": append(None if state is None else state.log_gates, gates),
            "window": window, "position": position}
    weights = 1.0
    if a is None:
        new = RecentKeys(**kept)
    else:  # relative to the largest key scale inside the window
        new = ScaledRecentKeys(**kept, log_scales=append(None if state is None else state.log_scales, a[:, None]))
        if lam is None and gates is None:
            weights = torch.exp(new.log_scales - new.log_scale[:, None])[..., None]
    if gates is not None:
        log_w = suffix_sums(new.log_gates, dim=1)  # (B, T, H, G)
        if a is not None:  # relative to the largest decayed key scale
            log_w = new.log_scales[..., None] + log_w
            log_w = log_w - log_w.detach().amax(dim=(1, 3), keepdim=True)
        weights = torch.exp(log_w)
    elif lam is not None:
        kept_n = new.keys.shape[1]
        log_w = (kept_n - 1 - torch.arange(kept_n, device=lam.device)).to(lam)[:, None] * lam  # (T, H)
        if a is not None:  # relative to the largest decayed key scale
            log_w = new.log_scales + log_w
            log_w = log_w - log_w.detach().amax(dim=1, keepdim=True)
        weights = torch.exp(log_w)[..., None]
    kv = torch.einsum("blhm,blhe->bhme", new.keys * weights, new.values)
    keys = new.keys if nk is None else new.normalizer_keys
    return kv, (keys * weights).sum(dim=1), new

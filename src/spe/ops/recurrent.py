"""Recurrent twins of the attention kernels: one decoding step from a typed state.

Letters: B = batch, H = num_heads, M = feature dimension of φ (M' of a separate normaliser),
D = query/key dimension, E = value dimension, W = window.

Each step equals the matching parallel kernel at that position (tests compare outputs and
final states, forward and backward): :func:`linear_attention_step` continues
:func:`~spe.ops.linear.causal_linear_attention` (plain, with RoPE's separate normaliser, and
windowed, with a decay or a gate), :func:`softmax_attention_step` continues
:func:`~spe.ops.softmax.softmax_attention` (with FoX's gate too; :func:`prefill_cache` builds
the cache a parallel pass leaves). Sums are kept in at least float32 with autocast off, as in
the parallel kernels.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.decay import check_log_decay
from spe.ops.feature_maps import ScaledFeatures, split_key_features
from spe.ops.gates import check_gates, is_gate, suffix_sums
from spe.ops.linear import (LinearState, check_linear_state, check_normalize, check_normaliser_features, kernel_dtype,
                            normalise)
from spe.ops.softmax import attend, check_window, softmax_gates
from spe.ops.state import (
    KVCache,
    LinearAttentionState,
    RecentKeys,
    ScaledLinearAttentionState,
    ScaledRecentKeys,
    check_state_window,
)

__all__ = ["append_to_cache", "linear_attention_step", "prefill_cache", "softmax_attention_step",
           "unchecked_linear_attention_step"]


def _check_one_position(**tensors: Tensor) -> None:
    for name, t in tensors.items():
        if t.dim() != 4 or t.shape[1] != 1:
            raise ValueError(f"a decoding step takes one position, {name} of shape (B, 1, H, ·), got {tuple(t.shape)}")


def linear_attention_step(phi_q: Tensor, phi_k: Tensor | ScaledFeatures, v: Tensor,
                          state: LinearState | None = None, *,
                          normalizer: tuple[Tensor, Tensor] | None = None, window: int | None = None,
                          key_log_scale: Tensor | None = None, log_decay: Tensor | None = None,
                          normalize: bool = True) -> tuple[Tensor, LinearState]:
    """One causal linear-attention step: y = φ(q)ᵀ S / ψ(q)ᵀ z with S, z updated by this key.

    Whole past: S ← S + φ(k) vᵀ, z ← z + ψ(k), O(M·E) per step at any position
    (:class:`~spe.ops.state.LinearAttentionState`). Window W: the last W keys and values are
    kept and the sums re-formed from them, O(W·M·E) (:class:`~spe.ops.state.RecentKeys`). With
    ``key_log_scale`` the state is kept relative to the running maximum c of the keys' log
    scales (S ← S e^{c_old − c} + …), as the chunked kernel does (:mod:`spe.ops.scaled`), in the
    ``Scaled`` subclasses.

    Args:
        phi_q: (B, 1, H, M) feature-mapped query of the new position.
        phi_k: (B, 1, H, M) its key features, or :class:`~spe.ops.feature_maps.ScaledFeatures`
            (FAVOR+: ``favor_key_features(k, projection)``), whose scale is read as ``key_log_scale``.
        v: (B, 1, H, E) its value.
        state: from the previous step or from
            :func:`~spe.ops.linear.causal_linear_attention_with_state`; None at position 0.
        normalizer: optional (query, key) features (B, 1, H, M') for the denominator only
            (RoPE: ``phi_q``, ``phi_k`` rotated, these unrotated).
        window: W, or None for the whole past; must match the state's.
        key_log_scale: (B, 1, H) a, the key's features being phi_k · e^a (FAVOR+); None when
            ``phi_k`` carries it.
        log_decay: (H,) λ = log γ (RetNet): S ← γ S + φ(k) vᵀ, z ← γ z + ψ(k) (with key
            scales: the state's log scale c + λ, then c ← max(c + λ, a)); with a window the
            kept keys weigh γ^{lag}. Must be the decay the state was built with. Or this
            position's gate (:mod:`spe.ops.gates`): (B, 1, H) G, S ← e^G S + φ(k) vᵀ (c ← max(c
            + G, a) with key scales), or (B, 1, H, M) per feature channel, S ← diag(e^G) S + …;
            with a window the state keeps the kept positions' gates.
        normalize: divide by the normaliser; False: y = φ(q)ᵀ S alone (normaliser-free, as
            :func:`~spe.ops.linear.causal_linear_attention`'s; no ``normalizer`` or
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
    _check_one_position(phi_q=phi_q, phi_k=phi_k, v=v)
    normalized = check_normalize(normalize, normalizer, key_log_scale)
    gates = None
    if is_gate(log_decay):
        gates = check_gates(log_decay, phi_q.shape, key_log_scale=key_log_scale is not None,
                            normalizer_features=None if normalizer is None else normalizer[0].shape[-1])
    elif log_decay is not None:
        check_log_decay(log_decay, phi_q.shape[2])
    check_window(window)
    check_linear_state(state, window=window, scaled=key_log_scale is not None, who="decoding state",
                       gate_channels=0 if gates is None else gates.shape[-1])
    dtype = kernel_dtype(phi_q, v)
    position = 1 + (0 if state is None else state.position)
    with torch.autocast(device_type=v.device.type, enabled=False):
        fq, fk, vf = phi_q.to(dtype), phi_k.to(dtype), v.to(dtype)
        nq, nk = (fq, fk) if normalizer is None else (t.to(dtype) for t in normalizer)
        state = None if state is None else state.to(dtype)
        a = None if key_log_scale is None else key_log_scale.to(dtype)[:, 0]  # (B, H)
        lam = None if log_decay is None else log_decay.to(dtype)
        if window is None:
            if gates is not None:  # (B, H) or, per channel, (B, H, M)
                lam = gates.to(dtype)[:, 0, :, 0] if gates.shape[-1] == 1 else gates.to(dtype)[:, 0]
            kv, z, new = _sums_step(state, fk, vf, nk, a, position, lam)
        elif gates is not None:
            kv, z, new = _window_step(state, fk, vf, None if normalizer is None else nk, a, window, position,
                                      gates=gates.to(dtype))
        else:
            kv, z, new = _window_step(state, fk, vf, None if normalizer is None else nk, a, window, position, lam)
        y = torch.einsum("blhm,bhme->blhe", fq, kv)
        if normalized:
            y = normalise(y, torch.einsum("blhm,bhm->blh", nq, z)[..., None])
    return y.to(v.dtype), new


def _sums_step(state: LinearAttentionState | None, fk: Tensor, vf: Tensor, nk: Tensor, a: Tensor | None,
               position: int, lam: Tensor | None = None) -> tuple[Tensor, Tensor, LinearAttentionState]:
    """Running sums with one more key: (S, z, the new state); ``lam`` (H,) log γ, a gate (B, H)
    or a channel gate (B, H, M) (without key scales), or None."""
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
        decay = torch.exp(lam).expand(state.normalizer.shape[:max(2, lam.dim())])  # (B, H) or (B, H, M)
    kv, z = torch.einsum("blhm,blhe->bhme", fk, vf), nk[:, 0]
    if state is not None:
        old_kv, old_z = state.kv, state.normalizer
        if decay is not None and decay.dim() == 3:  # per channel: diag(e^G) S
            old_kv, old_z = old_kv * decay[..., None], old_z * decay
        elif decay is not None:
            old_kv, old_z = old_kv * decay[..., None, None], old_z * decay[..., None]
        kv, z = old_kv + kv, old_z + z
    if a is None:
        return kv, z, LinearAttentionState(kv=kv, normalizer=z, position=position)
    return kv, z, ScaledLinearAttentionState(kv=kv, normalizer=z, position=position, log_scale=scale)


def _window_step(state: RecentKeys | None, fk: Tensor, vf: Tensor, nk: Tensor | None, a: Tensor | None,
                 window: int, position: int, lam: Tensor | None = None,
                 gates: Tensor | None = None) -> tuple[Tensor, Tensor, RecentKeys]:
    """The last W keys with this one (each relative to its own scale), and the sums they form:
    (S, z, the new state); ``nk`` None: no separate normaliser; ``lam`` (H,) log γ: the kept
    key t of T weighs γ^{T−1−t}; ``gates`` (B, 1, H, G) this position's gate: kept with the
    keys, key t weighs exp(Σ_{t<s<T} G_s)."""
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


def append_to_cache(cache: KVCache | None, k: Tensor, v: Tensor, *, window: int | None = None,
                    log_decay: Tensor | None = None) -> KVCache:
    """The cache with one more position's key (B, 1, H, D) and value (B, 1, H, E), keeping the
    last W with a window; with a gate (B, 1, H) (or (H,)) of that position, each cached key's
    log decay grows by it and the new key's is 0 (FoX).

    Raises:
        ValueError: on more than one position, a bad gate, or a cache of another window or
            gate form.
    """
    _check_one_position(k=k, v=v)
    check_window(window)
    check_state_window(cache, window)
    gate = None if log_decay is None else softmax_gates(log_decay, k.shape)  # (B, 1, H)
    if cache is not None and (cache.key_log_decay is None) != (gate is None):
        have, call = ("no gate", "one") if gate is not None else ("a gate", "none")
        raise ValueError(f"this KV cache was built with {have} (key_log_decay), the step has {call}: start "
                         f"decoding again from a fresh cache")
    if cache is None:
        return KVCache(keys=k, values=v, position=1, window=window,
                       key_log_decay=None if gate is None else torch.zeros_like(gate))
    keys, values = torch.cat([cache.keys, k], dim=1), torch.cat([cache.values, v], dim=1)
    decays = None if gate is None else torch.cat([cache.key_log_decay + gate.to(cache.key_log_decay),
                                                  torch.zeros_like(cache.key_log_decay[:, :1])], dim=1)
    if window is not None:
        keys, values = keys[:, -window:], values[:, -window:]
        decays = None if decays is None else decays[:, -window:]
    return KVCache(keys=keys, values=values, position=cache.position + 1, window=window, key_log_decay=decays)


def prefill_cache(k: Tensor, v: Tensor, *, window: int | None = None, log_decay: Tensor | None = None) -> KVCache:
    """The cache a causal parallel pass over keys (B, L, H, D) and values (B, L, H, E) leaves
    (the last W with a window), for :func:`softmax_attention_step` to continue; with the pass's
    gate (B, L, H) (or (H,)), each kept key's log decay to position L − 1, Σ_{n<t<L} G_t.

    Raises:
        ValueError: on a bad window or gate.
    """
    check_window(window)
    keep = slice(None) if window is None else slice(-window, None)
    decays = None if log_decay is None else suffix_sums(softmax_gates(log_decay, k.shape), dim=1)[:, keep]
    return KVCache(keys=k[:, keep], values=v[:, keep], position=k.shape[1], window=window, key_log_decay=decays)


def softmax_attention_step(q: Tensor, k: Tensor, v: Tensor, cache: KVCache | None = None, *,
                           window: int | None = None, log_decay: Tensor | None = None) -> tuple[Tensor, KVCache]:
    """One causal softmax-attention step: the query attends to the cached keys and its own.

    Args:
        q: (B, 1, H, D) query of the new position.
        k: (B, 1, H, D) its key.
        v: (B, 1, H, E) its value.
        cache: from the previous step or :func:`prefill_cache`; None at position 0.
        window: W, or None for the whole past; must match the cache's.
        log_decay: FoX's gate of this position, (B, 1, H) (or (H,)): logits gain each cached
            key's log decay (:class:`~spe.ops.state.KVCache`); must match the cache's form.

    Returns:
        (B, 1, H, E) output and the new cache.
    """
    _check_one_position(q=q)
    cache = append_to_cache(cache, k, v, window=window, log_decay=log_decay)
    bias = None if cache.key_log_decay is None else cache.key_log_decay.permute(0, 2, 1)[:, :, None, :]
    return attend(q, cache.keys, cache.values, bias), cache

"""Recurrent twins of the attention kernels: one decoding step from a typed state.

Letters: B = batch, H = num_heads, M = feature dimension of φ (M' of a separate normaliser),
D = query/key dimension, E = value dimension, W = window.

Each step equals the matching parallel kernel at that position (tests compare outputs and
final states, forward and backward): :func:`linear_attention_step` continues
:func:`~spe.ops.linear.causal_linear_attention` (plain, with RoPE's separate normaliser, and
windowed), :func:`softmax_attention_step` continues :func:`~spe.ops.softmax.softmax_attention`.
Sums are kept in at least float32 with autocast off, as in the parallel kernels.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.linear import kernel_dtype, normalise
from spe.ops.softmax import check_window, softmax_attention
from spe.ops.state import KVCache, LinearAttentionState, check_state_window

__all__ = ["append_to_cache", "linear_attention_step", "softmax_attention_step"]


def _check_one_position(**tensors: Tensor) -> None:
    for name, t in tensors.items():
        if t.dim() != 4 or t.shape[1] != 1:
            raise ValueError(f"a decoding step takes one position, {name} of shape (B, 1, H, ·), got {tuple(t.shape)}")


def linear_attention_step(phi_q: Tensor, phi_k: Tensor, v: Tensor, state: LinearAttentionState | None = None, *,
                          normalizer: tuple[Tensor, Tensor] | None = None, window: int | None = None,
                          key_log_scale: Tensor | None = None) -> tuple[Tensor, LinearAttentionState]:
    """One causal linear-attention step: y = φ(q)ᵀ S / ψ(q)ᵀ z with S, z updated by this key.

    Whole past: S ← S + φ(k) vᵀ, z ← z + ψ(k), O(M·E) per step at any position. Window W:
    the last W keys and values are kept and the sums re-formed from them (O(W·M·E)). With
    ``key_log_scale`` the state is kept relative to the running maximum c of the keys' log
    scales (S ← S e^{c_old − c} + …), as the chunked kernel does (:mod:`spe.ops.scaled`).

    Args:
        phi_q: (B, 1, H, M) feature-mapped query of the new position.
        phi_k: (B, 1, H, M) its key features.
        v: (B, 1, H, E) its value.
        state: from the previous step or from ``causal_linear_attention(...,
            output_final_state=True)``; None at position 0.
        normalizer: optional (query, key) features (B, 1, H, M') for the denominator only
            (RoPE: ``phi_q``, ``phi_k`` rotated, these unrotated).
        window: W, or None for the whole past; must match the state's.
        key_log_scale: (B, 1, H) a, the key's features being phi_k · e^a (FAVOR+).

    Returns:
        (B, 1, H, E) output in ``v``'s dtype, and the new state (position + 1).

    Raises:
        ValueError: on more than one position, or a state of another window, normaliser or
            key-scale form.
    """
    _check_one_position(phi_q=phi_q, phi_k=phi_k, v=v)
    check_window(window)
    check_state_window(state, window)
    if state is not None and (state.log_scale is None) != (key_log_scale is None):
        raise ValueError("the decoding state and this step disagree on key_log_scale")
    dtype = kernel_dtype(phi_q, v)
    with torch.autocast(device_type=v.device.type, enabled=False):
        fq, fk, vf = phi_q.to(dtype), phi_k.to(dtype), v.to(dtype)
        nq, nk = (fq, fk) if normalizer is None else (t.to(dtype) for t in normalizer)
        state = None if state is None else state.to(dtype)
        scale, decay = None, None
        if key_log_scale is not None and window is not None:
            scale = key_log_scale.to(dtype)[:, 0]  # keys stay relative to their own scale
        elif key_log_scale is not None:
            a = key_log_scale.to(dtype)[:, 0]  # (B, H)
            scale = a if state is None else torch.maximum(state.log_scale, a)
            decay = None if state is None else torch.exp(state.log_scale - scale)
            factor = torch.exp(a - scale)[:, None, :, None]
            fk, nk = fk * factor, nk * factor
        if window is None:
            kv, z = torch.einsum("blhm,blhe->bhme", fk, vf), nk[:, 0]
            if state is not None:
                old_kv, old_z = (state.kv, state.normalizer) if decay is None else (
                    state.kv * decay[..., None, None], state.normalizer * decay[..., None])
                kv, z = old_kv + kv, old_z + z
            new = LinearAttentionState(kv=kv, normalizer=z, log_scale=scale)
        else:
            new = _append_recent(state, fk, vf, None if normalizer is None else nk, scale, window)
            weights = 1.0
            if scale is not None:  # relative to the largest key scale inside the window
                new.log_scale = new.recent_log_scales.amax(dim=1)
                weights = torch.exp(new.recent_log_scales - new.log_scale[:, None])[..., None]
            kv = torch.einsum("blhm,blhe->bhme", new.recent_keys * weights, new.recent_values)
            keys = new.recent_keys if normalizer is None else new.recent_normalizer_keys
            z = (keys * weights).sum(dim=1)
        y = normalise(torch.einsum("blhm,bhme->blhe", fq, kv), torch.einsum("blhm,bhm->blh", nq, z)[..., None])
    new.position, new.window = (0 if state is None else state.position) + 1, window
    return y.to(v.dtype), new


def _append_recent(state: LinearAttentionState | None, fk: Tensor, vf: Tensor, nk: Tensor | None,
                   scale: Tensor | None, window: int) -> LinearAttentionState:
    recent_scale = None if scale is None else scale[:, None]
    if state is None:
        return LinearAttentionState(recent_keys=fk, recent_values=vf, recent_normalizer_keys=nk,
                                    log_scale=scale, recent_log_scales=recent_scale)

    def append(old: Tensor | None, new: Tensor | None) -> Tensor | None:
        return None if new is None else torch.cat([old, new], dim=1)[:, -window:]

    if (state.recent_normalizer_keys is None) != (nk is None):
        raise ValueError("the decoding state and this step disagree on a separate normaliser")
    return LinearAttentionState(
        recent_keys=append(state.recent_keys, fk), recent_values=append(state.recent_values, vf),
        recent_normalizer_keys=append(state.recent_normalizer_keys, nk), log_scale=scale,
        recent_log_scales=append(state.recent_log_scales, recent_scale))


def append_to_cache(cache: KVCache | None, k: Tensor, v: Tensor, *, window: int | None = None) -> KVCache:
    """The cache with one more position's key (B, 1, H, D) and value (B, 1, H, E), keeping the
    last W with a window.

    Raises:
        ValueError: on more than one position, or a cache of another window.
    """
    _check_one_position(k=k, v=v)
    check_window(window)
    check_state_window(cache, window)
    if cache is None:
        return KVCache(keys=k, values=v, position=1, window=window)
    keys, values = torch.cat([cache.keys, k], dim=1), torch.cat([cache.values, v], dim=1)
    if window is not None:
        keys, values = keys[:, -window:], values[:, -window:]
    return KVCache(keys=keys, values=values, position=cache.position + 1, window=window)


def softmax_attention_step(q: Tensor, k: Tensor, v: Tensor, cache: KVCache | None = None, *,
                           window: int | None = None) -> tuple[Tensor, KVCache]:
    """One causal softmax-attention step: the query attends to the cached keys and its own.

    Args:
        q: (B, 1, H, D) query of the new position.
        k: (B, 1, H, D) its key.
        v: (B, 1, H, E) its value.
        cache: from the previous step; None at position 0.
        window: W, or None for the whole past; must match the cache's.

    Returns:
        (B, 1, H, E) output and the new cache.
    """
    _check_one_position(q=q)
    cache = append_to_cache(cache, k, v, window=window)
    return softmax_attention(q, cache.keys, cache.values, causal=False), cache

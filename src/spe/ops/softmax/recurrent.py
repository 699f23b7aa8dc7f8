"""The recurrent twin of softmax attention: one decoding step from a KV cache.

Letters: B = batch, H = num_heads, D = query/key dimension, E = value dimension, W = window.

:func:`softmax_attention_step` continues :func:`~spe.ops.softmax.chunk.softmax_attention` (with
FoX's gate too; :func:`prefill_cache` builds the cache a parallel pass leaves); each step equals
the parallel kernel at that position.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.common.checks import check_one_position, check_window
from spe.ops.decay.sums import suffix_sums
from spe.ops.softmax.checks import softmax_gates
from spe.ops.softmax.chunk import attend
from spe.ops.common.state import KVCache, check_state_window

__all__ = ["append_to_cache", "prefill_cache", "softmax_attention_step"]


def append_to_cache(cache: KVCache | None, k: Tensor, v: Tensor, *, window: int | None = None,
                    log_decay: Tensor | None = None) -> KVCache:
    """The cache with one more position's key (B, 1, H, D) and value (B, 1, H, E), keeping the
    last W with a window; with a gate (B, 1, H) (or (H,)) of that position, each cached key's
    log decay grows by it and the new key's is 0 (FoX).

    Raises:
        ValueError: on more than one position, a bad gate, or a cache of another window or
            gate form.
    """
    check_one_position(k=k, v=v)
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
            key's log decay (:class:`~spe.ops.common.state.KVCache`); must match the cache's form.

    Returns:
        (B, 1, H, E) output and the new cache.
    """
    check_one_position(q=q)
    cache = append_to_cache(cache, k, v, window=window, log_decay=log_decay)
    bias = None if cache.key_log_decay is None else cache.key_log_decay.permute(0, 2, 1)[:, :, None, :]
    return attend(q, cache.keys, cache.values, bias), cache

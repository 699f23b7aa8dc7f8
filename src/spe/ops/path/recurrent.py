"""PaTH attention, one decoding step from a KV cache of transformed keys.

Letters: B = batch, T = cached positions, H = num_heads, D = head_dim, E = value dimension.

The cache holds each past key carried to the newest position, k̃_n = H_{t−1} ⋯ H_{n+1} k_n. When
token t arrives every cached key is multiplied by H_t = I − β_t w_t w_tᵀ (a rank-one update,
O(T·D)); its own key joins untransformed (the product from n + 1 to m is empty for n = m), and
the query attends to them as softmax attention does: s_tn = scale · q_t·k̃_n (+ FoX's gate,
kept by the cache as in :func:`~spe.ops.softmax_attention_step`). fla keeps the same cache
(``layers/path_attn.py``: the rank-one update of ``past_k`` before each step).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from spe.ops.linear_attn.options import kernel_dtype
from spe.ops.path.checks import check_path_inputs
from spe.ops.path.chunk import DEFAULT_CHUNK_SIZE, path_transformed_keys
from spe.ops.softmax.recurrent import prefill_cache, softmax_attention_step
from spe.ops.common.state import KVCache

__all__ = ["path_attention_step", "path_prefill_cache"]


def path_attention_step(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor,
                        cache: KVCache | None = None, *, log_decay: Tensor | None = None,
                        scale: float | None = None) -> tuple[Tensor, KVCache]:
    """One causal PaTH step: equals :func:`~spe.ops.path.path_attention` at the new position.

    Args:
        q, k, w: (B, 1, H, D) of the new position (w of unit norm); v: (B, 1, H, E); beta: (B, 1, H).
        cache: from the previous step or :func:`path_prefill_cache` (keys already carried to
            the previous position), None at position 0. No window.
        log_decay: (B, 1, H) FoX's gate at this position, or None; must match the cache's form.
        scale: as :func:`~spe.ops.path.path_attention`.

    Returns:
        (B, 1, H, E) output and the new cache (keys carried to this position).

    Raises:
        ValueError: as :func:`~spe.ops.path.path_attention`, for more than one position or a
            windowed cache.
    """
    _, scale = check_path_inputs(q, k, v, w, beta, log_decay=log_decay, scale=scale)
    if q.shape[1] != 1:
        raise ValueError(f"a decoding step takes one position, q of shape (B, 1, H, D), got {tuple(q.shape)}")
    if cache is not None and cache.window is not None:
        raise ValueError(f"PaTH carries every past key through each new H_t: its cache has no window, got "
                         f"window {cache.window}")
    if cache is not None:
        keys = cache.keys.to(kernel_dtype(cache.keys, w))
        w_t, beta_t = w.to(keys.dtype), beta.to(keys.dtype)[..., None]
        keys = keys - beta_t * (keys * w_t).sum(-1, keepdim=True) * w_t  # H_t k̃_n
        cache = replace(cache, keys=keys.to(cache.keys.dtype))
    # softmax_attention_step scales by 1/√D: fold the rest of ``scale`` into the query
    y, cache = softmax_attention_step(q * (scale * math.sqrt(q.shape[-1])), k, v, cache, log_decay=log_decay)
    return y, cache


def path_prefill_cache(k: Tensor, v: Tensor, w: Tensor, beta: Tensor, *, log_decay: Tensor | None = None,
                       chunk_size: int = DEFAULT_CHUNK_SIZE) -> KVCache:
    """The cache a causal PaTH pass over L positions leaves, for :func:`path_attention_step` to
    continue: keys carried to position L − 1 (:func:`~spe.ops.path.chunk.path_transformed_keys`),
    values, and with a gate (B, L, H) each key's log decay to L − 1.

    Args:
        k, w: (B, L, H, D) (w of unit norm); v: (B, L, H, E); beta: (B, L, H); log_decay: (B, L, H) or None.

    Raises:
        ValueError: as :func:`~spe.ops.path.path_attention`.
    """
    check_path_inputs(k, k, v, w, beta, log_decay=log_decay, scale=None)
    dtype = kernel_dtype(k, w)
    with torch.autocast(k.device.type, enabled=False):
        keys = path_transformed_keys(k.to(dtype), w.to(dtype), beta.to(dtype), chunk_size=chunk_size)
    return prefill_cache(keys.to(k.dtype), v, log_decay=log_decay)

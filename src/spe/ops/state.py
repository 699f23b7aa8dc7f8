"""Typed decoding states of the attention kernels (flash-linear-attention's ``initial_state`` /
``output_final_state`` pattern): what a kernel needs to go on from where it stopped.

Letters: B = batch, H = num_heads, M = feature dimension of φ (M' of a separate normaliser),
E = value dimension, D = query/key dimension, W = window, T = positions kept.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

__all__ = ["AttentionState", "KVCache", "LinearAttentionState"]


def _cast(state, dtype: torch.dtype):
    values = {f.name: getattr(state, f.name) for f in fields(state)}
    return replace(state, **{k: v.to(dtype) for k, v in values.items()
                             if isinstance(v, Tensor) and v.is_floating_point()})


@dataclass
class LinearAttentionState:
    """State of causal linear attention after ``position`` positions.

    Whole past (``window`` None): the running sums, so every step costs the same::

        kv = Σ_n φ(k_n) v_nᵀ  (B, H, M, E),   normalizer = Σ_n ψ(k_n)  (B, H, M'),

    with ψ = φ unless the kernel was given a separate normaliser (RoPE: rotated φ above,
    unrotated ψ below, RoFormer eq. 19). Sliding window W: the last min(W, position) keys'
    features and values instead (O(W) memory), from which each step re-forms its sums, so no
    running subtraction can leave rounding residues.

    Attributes:
        kv: (B, H, M, E), or None with a window.
        normalizer: (B, H, M'), or None with a window.
        recent_keys: (B, T, H, M) with a window, else None.
        recent_values: (B, T, H, E) with a window, else None.
        recent_normalizer_keys: (B, T, H, M') with a window and a separate normaliser, else None.
        position: positions seen so far (RoPE and SPE need the next one's index).
        window: W the state was built with (None: the whole past).
        log_scale: (B, H) running maximum c of the keys' log scales when the kernel was given
            ``key_log_scale`` (FAVOR+, :mod:`spe.ops.scaled`): ``kv`` and ``normalizer`` are
            then relative to e^c; None otherwise.
        recent_log_scales: (B, T, H) the running maxima at the recent keys (window and
            ``key_log_scale``), to which those keys' features are relative; else None.
    """

    kv: Tensor | None = None
    normalizer: Tensor | None = None
    recent_keys: Tensor | None = None
    recent_values: Tensor | None = None
    recent_normalizer_keys: Tensor | None = None
    position: int = 0
    window: int | None = None
    log_scale: Tensor | None = None
    recent_log_scales: Tensor | None = None

    def to(self, dtype: torch.dtype) -> LinearAttentionState:
        """A copy with floating tensors cast to ``dtype``."""
        return _cast(self, dtype)


@dataclass
class KVCache:
    """Keys and values of softmax attention seen so far (the last W with a window).

    Attributes:
        keys: (B, T, H, D).
        values: (B, T, H, E).
        position: positions seen so far (the next query's index).
        window: W the cache was built with (None: the whole past).
    """

    keys: Tensor
    values: Tensor
    position: int = 0
    window: int | None = None

    def to(self, dtype: torch.dtype) -> KVCache:
        """A copy with floating tensors cast to ``dtype``."""
        return _cast(self, dtype)


def check_state_window(state, window: int | None) -> None:
    """Raises ValueError if a state was built with another window than the one asked for now."""
    if state is not None and state.window != window:
        raise ValueError(f"this decoding state was built with attention window {state.window}, the kernel now "
                         f"has {window}: start decoding again from a fresh state")


# What a decoding step hands from one position to the next, whatever the kernel: callers above
# ops/ (blocks, models, generation) hold it without looking inside.
AttentionState = KVCache | LinearAttentionState

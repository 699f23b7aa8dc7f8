"""Typed decoding states of the attention kernels (flash-linear-attention's ``initial_state`` /
``output_final_state`` pattern): what a kernel needs to go on from where it stopped.

Letters: B = batch, H = num_heads, M = feature dimension of φ (M' of a separate normaliser),
E = value dimension, D = query/key dimension, W = window, T = positions kept.

One type per kind of memory, each with only the fields it needs (a missing one is a
``TypeError`` at construction, a shape that does not fit the others a ``ValueError``):

==========================  ==============================  ===========================
type                        holds                           kernels
==========================  ==============================  ===========================
:class:`LinearAttentionState`   running sums of the whole past  linear (relu, elu+1)
:class:`ScaledLinearAttentionState`  the same relative to e^c   FAVOR+ (key log scales)
:class:`RecentKeys`         the last W keys' features, values   linear with a window
:class:`ScaledRecentKeys`   the same with their log scales      FAVOR+ with a window
:class:`KVCache`            keys and values (the last W)        softmax
==========================  ==============================  ===========================

The scaled types are subclasses of the plain ones (a FAVOR+ state *is* a linear-attention
state, with its scale); :data:`AttentionState` is the union that callers above ``ops/``
hold without looking inside.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar

import torch
from torch import Tensor

from spe.ops.common.checks import check_window

__all__ = ["AttentionState", "KVCache", "LinearAttentionState", "RecentKeys", "ScaledLinearAttentionState",
           "ScaledRecentKeys", "WrappedState", "check_state_window"]


def _cast(state, dtype: torch.dtype):
    values = {f.name: getattr(state, f.name) for f in fields(state)}
    return replace(state, **{k: v.to(dtype) for k, v in values.items()
                             if isinstance(v, Tensor) and v.is_floating_point()})


def _shape_error(kind: str, **tensors: Tensor) -> ValueError:
    shapes = ", ".join(f"{name} {tuple(t.shape)}" for name, t in tensors.items())
    return ValueError(f"inconsistent {kind}: {shapes}")


def _check_position(kind: str, position: int, kept: int) -> None:
    if isinstance(position, bool) or not isinstance(position, int) or position < kept:
        raise ValueError(f"{kind}: position must be an int ≥ the {kept} positions it holds, got {position!r}")


@dataclass(frozen=True, kw_only=True)
class LinearAttentionState:
    """Causal linear attention after ``position`` positions, the whole past as running sums::

        kv = Σ_n φ(k_n) v_nᵀ  (B, H, M, E),   normalizer = Σ_n ψ(k_n)  (B, H, M'),

    with ψ = φ unless the kernel was given a separate normaliser (RoPE: rotated φ above,
    unrotated ψ below, RoFormer eq. 19). Every step costs the same, O(M·E).

    Attributes:
        kv: (B, H, M, E).
        normalizer: (B, H, M').
        position: positions seen so far (RoPE and SPE need the next one's index).

    Raises:
        TypeError: on a missing field. ValueError: on shapes that do not fit together.
    """

    window: ClassVar[None] = None  # the whole past
    kv: Tensor
    normalizer: Tensor
    position: int = 0

    def __post_init__(self) -> None:
        if self.kv.dim() != 4 or self.normalizer.dim() != 3 or self.kv.shape[:2] != self.normalizer.shape[:2]:
            raise _shape_error(type(self).__name__, kv=self.kv, normalizer=self.normalizer)
        _check_position(type(self).__name__, self.position, 0)

    def to(self, dtype: torch.dtype):
        """A copy with floating tensors cast to ``dtype``."""
        return _cast(self, dtype)


@dataclass(frozen=True, kw_only=True)
class ScaledLinearAttentionState(LinearAttentionState):
    """:class:`LinearAttentionState` of keys given with log scales (FAVOR+, :mod:`spe.ops.common.scaled`):
    ``kv`` and ``normalizer`` are relative to e^c, c the running maximum of the keys' log scales.

    Attributes:
        log_scale: (B, H) c, in nats.
    """

    log_scale: Tensor

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.log_scale.shape != self.kv.shape[:2]:
            raise _shape_error(type(self).__name__, kv=self.kv, log_scale=self.log_scale)


@dataclass(frozen=True, kw_only=True)
class RecentKeys:
    """Causal linear attention with a sliding window W: the last T = min(W, position) keys'
    features and values (O(W) memory), from which each step re-forms its sums, so no running
    subtraction can leave rounding residues.

    Attributes:
        keys: (B, T, H, M) features φ(k_n).
        values: (B, T, H, E).
        window: W, positive.
        position: positions seen so far.
        normalizer_keys: (B, T, H, M') features ψ(k_n) of a separate normaliser, or None:
            the kernel's form (RoPE, RoFormer eq. 19), not a missing value; the kernels refuse
            to continue a state of the other form.
        log_gates: (B, T, H, G) the kept positions' gates (:mod:`spe.ops.decay.forms`; G = 1 for a
            gate per head, M per feature channel), from which each step weighs the kept keys;
            None for kernels without a data-dependent gate (the kernels refuse the other form).

    Raises:
        TypeError: on a missing field. ValueError: on a bad window, more than W positions or
            shapes that do not fit together.
    """

    keys: Tensor
    values: Tensor
    window: int
    position: int = 0
    normalizer_keys: Tensor | None = None
    log_gates: Tensor | None = None

    def __post_init__(self) -> None:
        check_window(self.window)
        if self.window is None:
            raise ValueError(f"{type(self).__name__} keeps a window: window must be a positive int, got None")
        kept = self.keys.shape[1] if self.keys.dim() == 4 else -1
        extra = {name: t for name, t in (("normalizer_keys", self.normalizer_keys), ("log_gates", self.log_gates))
                 if t is not None}
        gates_fit = self.log_gates is None or (self.log_gates.dim() == 4 and self.log_gates.shape[-1] in (
            1, self.keys.shape[-1]))
        if kept < 0 or self.values.shape[:3] != self.keys.shape[:3] or kept > self.window or not gates_fit or any(
                t.shape[:3] != self.keys.shape[:3] for t in extra.values()):
            raise _shape_error(f"{type(self).__name__} (window {self.window})", keys=self.keys, values=self.values,
                               **extra)
        _check_position(type(self).__name__, self.position, kept)

    def to(self, dtype: torch.dtype):
        """A copy with floating tensors cast to ``dtype``."""
        return _cast(self, dtype)


@dataclass(frozen=True, kw_only=True)
class ScaledRecentKeys(RecentKeys):
    """:class:`RecentKeys` of keys given with log scales (FAVOR+): each key's features are
    relative to its own scale (:func:`spe.ops.common.scaled.scaled_window_sums`).

    Attributes:
        log_scales: (B, T, H) a_n of the kept keys, in nats.
    """

    log_scales: Tensor

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.log_scales.shape != self.keys.shape[:3]:
            raise _shape_error(type(self).__name__, keys=self.keys, log_scales=self.log_scales)

    @property
    def log_scale(self) -> Tensor:
        """(B, H) the largest log scale inside the window (the sums' common scale)."""
        return self.log_scales.amax(dim=1)


@dataclass(frozen=True, kw_only=True)
class KVCache:
    """Keys and values of softmax attention seen so far (the last W with a window).

    Attributes:
        keys: (B, T, H, D).
        values: (B, T, H, E).
        position: positions seen so far (the next query's index).
        window: W the cache was built with (None: the whole past).
        key_log_decay: (B, T, H) with a gate (FoX, :mod:`spe.ops.softmax`): each cached key's log
            decay to the newest position, Σ_{n<t≤newest} G_t (≤ 0), kept by adding each new
            gate, never as a difference of running sums; None without a gate (the steps refuse
            the other form).

    Raises:
        TypeError: on a missing field. ValueError: on a bad window, more than W positions or
            shapes that do not fit together.
    """

    keys: Tensor
    values: Tensor
    position: int = 0
    window: int | None = None
    key_log_decay: Tensor | None = None

    def __post_init__(self) -> None:
        check_window(self.window)
        kept = self.keys.shape[1] if self.keys.dim() == 4 else -1
        decay = {} if self.key_log_decay is None else {"key_log_decay": self.key_log_decay}
        if kept < 0 or self.values.shape[:3] != self.keys.shape[:3] or (self.window is not None
                                                                       and kept > self.window) or any(
                t.shape != self.keys.shape[:3] for t in decay.values()):
            raise _shape_error(f"KVCache (window {self.window})", keys=self.keys, values=self.values, **decay)
        _check_position("KVCache", self.position, kept)

    def to(self, dtype: torch.dtype) -> KVCache:
        """A copy with floating tensors cast to ``dtype``."""
        return _cast(self, dtype)


# What a decoding step hands from one position to the next, whatever the kernel: callers above
# ops/ (blocks, models, generation) hold it without looking inside. (The scaled types are
# subclasses of the plain ones.)
AttentionState = KVCache | LinearAttentionState | RecentKeys


class WrappedState:
    """A layer's decoding state around a kernel state, ``inner`` (a dataclass field of the
    subclass), with what the layer adds (a short convolution's cache, a token shift's last keys):
    its position and window are the inner state's."""

    @property
    def position(self) -> int:
        """Positions seen so far (the kernel state's)."""
        return self.inner.position

    @property
    def window(self) -> int | None:
        """The attention window the kernel state was built with."""
        return self.inner.window

    def to(self, dtype: torch.dtype):
        """A copy with the inner state and the floating tensors cast to ``dtype``."""
        return replace(_cast(self, dtype), inner=self.inner.to(dtype))


def check_state_window(state, window: int | None) -> None:
    """Raises ValueError if a state was built with another window than the one asked for now."""
    if state is not None and state.window != window:
        raise ValueError(f"this decoding state was built with attention window {state.window}, the kernel now "
                         f"has {window}: start decoding again from a fresh state")

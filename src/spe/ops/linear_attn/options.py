"""What every linear-attention kernel shares: the options record, the normaliser, precision
and key-scale helpers, and the state forms.

Letters: B = batch, L = length, H = num_heads, M = feature dimension of φ, E = value dimension.

A kernel's options travel as one frozen record, :class:`LinearKernelOptions`, decoded and checked
once at a public function's entry (the decay as its named form, :mod:`spe.ops.decay.forms`);
the chunked form and the recurrent step read the same record.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from spe.ops.decay.forms import ChannelGate, ConstantDecay, Decay, ScalarGate
from spe.ops.common.feature_maps import ScaledFeatures, split_key_features
from spe.ops.common.state import (
    LinearAttentionState,
    RecentKeys,
    ScaledLinearAttentionState,
    ScaledRecentKeys,
    check_state_window,
)

__all__ = ["LinearKernelOptions", "LinearState", "check_linear_state", "check_normalize", "check_normaliser_features",
           "check_normalizer", "constant_log_decay", "full_precision", "gate_channels", "kernel_dtype", "mask_keys",
           "normalise", "normalised", "rescale_keys", "to_plain_state", "to_scaled_state", "with_ones"]


@dataclass(frozen=True, kw_only=True)
class LinearKernelOptions:
    """The options a linear-attention kernel reads besides its tensors, checked once.

    Attributes:
        chunk_size: C, positions per chunk of the chunked form (≥ 1; unused by the step).
        window: W, keys m − W < n ≤ m; None: the whole past.
        normalize: divide by the normaliser; False: the numerator alone.
        key_log_scale: (B, L, H) a_n, keys' features relative to e^{a_n}; None: none.
        position: the position after this call (the final state's).
        decay: the decay's named form (:func:`spe.ops.decay.forms.decode_decay`), or None.
        group_size: positions per group of chunks (whole past, no decay, no key scales); None: all.
    """

    chunk_size: int = 64
    window: int | None = None
    normalize: bool = True
    key_log_scale: Tensor | None = None
    position: int = 0
    decay: Decay | None = None
    group_size: int | None = None


def constant_log_decay(decay: Decay | None) -> Tensor | None:
    """λ (H,) of a :class:`~spe.ops.decay.forms.ConstantDecay`, else None."""
    return decay.log_decay if isinstance(decay, ConstantDecay) else None


def gate_channels(decay: Decay | None) -> int:
    """G of a gate (1 for a scalar gate, M for a channel gate), 0 for no gate."""
    return decay.gates.shape[-1] if isinstance(decay, (ScalarGate, ChannelGate)) else 0


# What causal linear attention continues from and returns: running sums (whole past) or the
# recent keys (window), each with a ``Scaled`` subclass for keys with log scales.
LinearState = LinearAttentionState | RecentKeys


def full_precision(fn):
    """Runs a kernel in at least float32 with autocast off, returning the values' dtype.

    The carried state sums up to L outer products: in bfloat16/float16 it would lose most of
    its precision (and overflow in float16) long before L = 10⁴. Tensors in ``initial_state``
    and ``normalizer`` are promoted too; a returned final state stays in the kernel's dtype.
    A ``phi_k`` given as :class:`~spe.ops.common.feature_maps.ScaledFeatures` becomes its features and
    ``key_log_scale`` first, so every decorated kernel accepts one.
    """

    @functools.wraps(fn)
    def wrapper(phi_q: Tensor, phi_k: Tensor | ScaledFeatures, v: Tensor, **kwargs):
        phi_k, key_log_scale = split_key_features(phi_k, kwargs.get("key_log_scale"))
        if key_log_scale is not None:
            kwargs["key_log_scale"] = key_log_scale
        dtype = kernel_dtype(phi_q, v)
        if kwargs.get("normalizer") is not None:
            kwargs["normalizer"] = tuple(t.to(dtype) for t in kwargs["normalizer"])
        for name in ("initial_state", "key_log_scale", "log_decay"):
            if kwargs.get(name) is not None and (name != "log_decay" or _floating(kwargs[name])):
                kwargs[name] = kwargs[name].to(dtype)  # a decay of another type goes to its check
        with torch.autocast(device_type=v.device.type, enabled=False):
            out = fn(phi_q.to(dtype), phi_k.to(dtype), v.to(dtype), **kwargs)
        if isinstance(out, tuple):
            return out[0].to(v.dtype), out[1]
        return out.to(v.dtype)

    return wrapper


def _floating(t) -> bool:
    return isinstance(t, Tensor) and t.is_floating_point()


def kernel_dtype(*tensors: Tensor) -> torch.dtype:
    """The dtype the kernels compute in: the widest of the inputs', at least float32."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def with_ones(v: Tensor) -> Tensor:
    # A trailing column of ones makes the normaliser Σ φ(q)ᵀφ(k) come out of the same products.
    return torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)


def normalise(num: Tensor, den: Tensor) -> Tensor:
    """num / den, with 0 where den is exactly 0.

    With non-negative features den = Σ_n φ(q_m)ᵀφ(k_n) ≥ 0 and num is the same weighted sum
    of values, so the ratio is a weighted mean of values for any den > 0, however small: a
    fixed ε would instead shrink outputs whose den falls near it (FAVOR+ key features have no
    absolute scale). den = 0 means no key has any weight (ReLU features):
    the output is then 0, with zero gradient.

    Args:
        num: (…, E) numerators.
        den: (…, 1) denominators.
    """
    nonzero = den != 0
    return torch.where(nonzero, num / torch.where(nonzero, den, torch.ones_like(den)), torch.zeros_like(num))


def normalised(num_den: Tensor, normalize: bool) -> Tensor:
    # normalize False: the numerator alone (the normaliser column is still summed, so the states
    # keep one form)
    return normalise(num_den[..., :-1], num_den[..., -1:]) if normalize else num_den[..., :-1]


def check_normalize(normalize: bool, normalizer, key_log_scale) -> bool:
    """``normalize``, checked: False (the numerator alone) takes no normaliser and no key scales.

    Raises:
        ValueError: on ``normalize=False`` with a separate normaliser or key log scales.
    """
    if not normalize and (normalizer is not None or key_log_scale is not None):
        raise ValueError("normalize=False gives the numerator Σ_n w_mn φ(q_m)ᵀφ(k_n) v_n alone: it takes no "
                         "separate normalizer and no key_log_scale (sums relative to a scale)")
    return normalize


def check_normaliser_features(phi_q: Tensor, phi_k, normalizer, normalize: bool, who: str) -> None:
    """The normaliser's rule for the public kernels: ψ(q_m)ᵀ Σ_n ψ(k_n) is a sum of weights,
    so its features ψ (``normalizer``, else ``phi_q`` and ``phi_k``) must be non-negative;
    signed ones (SPE's q̂, k̂, raw projections) can make it 0 or negative and the outputs
    arbitrarily large (the layer never passes them: its linear kernels' φ is non-negative).

    Raises:
        ValueError: with ``normalize=True``, if a normaliser feature is negative, saying what
            to pass instead.
    """
    if not normalize:
        return
    phi_k = phi_k.features if isinstance(phi_k, ScaledFeatures) else phi_k
    named = (("phi_q", phi_q), ("phi_k", phi_k)) if normalizer is None else tuple(
        zip(("normalizer[0]", "normalizer[1]"), normalizer))
    for name, t in named:
        if isinstance(t, Tensor) and t.numel() and bool((t < 0).any()):
            raise ValueError(f"{who}: {name} has negative entries, which can make the normaliser Σ_n "
                             f"ψ(q_m)ᵀψ(k_n) zero or negative (e.g. SPE's signed q̂, k̂): pass non-negative "
                             f"features (spe.ops.elu_feature_map of each, or FAVOR+), or normalize=False for the "
                             f"numerator alone (normaliser-free, attention 'linear')")


def rescale_keys(phi_k: Tensor, normalizer, key_log_scale: Tensor | None):
    """Keys brought to one common scale, e^{a_n − max a} (for non-causal use and references).

    phi_k: (B, Lk, H, M) features relative to e^{a_n}; normalizer: None or (ψ(q), ψ(k)) with
    ψ(k) (B, Lk, H, M') relative to the same scales; key_log_scale: (B, Lk, H) a_n, or None
    (nothing to do). Returns (phi_k, normalizer) relative to e^{max_n a_n} per (example, head).

    Padding keys come with a = −∞ (:func:`mask_keys`) and so never set the maximum; an
    example whose keys are all padding has max a = −∞ and no common scale: its factors are
    taken against 0 (they are e^{−∞} = 0, as are its features)."""
    if key_log_scale is None:
        return phi_k, normalizer
    top = key_log_scale.amax(dim=1, keepdim=True)
    top = top.masked_fill(top == -math.inf, 0.0)
    factor = torch.exp(key_log_scale - top)[..., None]
    return phi_k * factor, None if normalizer is None else (normalizer[0], normalizer[1] * factor)


def mask_keys(mask: Tensor, phi_k: Tensor, v: Tensor, normalizer, key_log_scale: Tensor | None):
    """Zeroes padding keys (mask (B, Lk), True at padding) in every sum a key enters; their log
    scale becomes −∞, so that padding can never be the common scale (a finite sentinel such as
    −10⁴ would be, once every real key's log scale lies below it, and zero the example)."""
    if mask.shape != phi_k.shape[:2] or mask.dtype != torch.bool:
        raise ValueError(f"key_padding_mask must be a (batch, keys) = {tuple(phi_k.shape[:2])} bool tensor, got "
                         f"{mask.dtype} {tuple(mask.shape)}")
    keep = (~mask)[..., None, None]  # (B, Lk, 1, 1)
    phi_k, v = phi_k * keep, v * keep
    if normalizer is not None:
        normalizer = (normalizer[0], normalizer[1] * keep)
    if key_log_scale is not None:
        key_log_scale = key_log_scale.masked_fill(mask[..., None], -math.inf)
    return phi_k, v, normalizer, key_log_scale


def check_normalizer(normalizer, phi_q: Tensor, phi_k: Tensor) -> tuple[Tensor, Tensor]:
    nq, nk = normalizer
    if nq.shape[:-1] != phi_q.shape[:-1] or nk.shape[:-1] != phi_k.shape[:-1]:
        raise ValueError(f"normalizer features must match the queries' and keys' (batch, length, heads), got "
                         f"{tuple(nq.shape)} and {tuple(nk.shape)} for {tuple(phi_q.shape)} and {tuple(phi_k.shape)}")
    return nq.to(phi_q.dtype), nk.to(phi_q.dtype)


def check_linear_state(state, *, window: int | None, scaled: bool, who: str = "initial state",
                       gate_channels: int = 0) -> None:
    """Refuses a linear-attention state that does not fit a call (window, key scales, and for
    a window the gate: ``gate_channels`` G of the call's gate, 0 without one).

    Raises:
        TypeError: if ``state`` is not a linear-attention state.
        ValueError: on another window, key scales in one and not the other, or kept keys
            without the call's gate (or with one the call does not have).
    """
    if state is None:
        return
    if not isinstance(state, (LinearAttentionState, RecentKeys)):
        raise TypeError(f"linear attention continues from a LinearAttentionState or RecentKeys, got "
                        f"{type(state).__name__}")
    check_state_window(state, window)
    if isinstance(state, (ScaledLinearAttentionState, ScaledRecentKeys)) != scaled:
        raise ValueError(f"the {who} and this call disagree on key_log_scale")
    kept = 0 if not isinstance(state, RecentKeys) or state.log_gates is None else state.log_gates.shape[-1]
    if isinstance(state, RecentKeys) and kept != gate_channels:
        have, call = (f"gates with {g} channel(s)" if g else "no gate" for g in (kept, gate_channels))
        raise ValueError(f"the {who} holds {have} for its kept keys, this call has {call}")


def to_scaled_state(state: LinearState) -> LinearState:
    """A plain linear-attention state as its ``Scaled`` subclass with log scales 0 (unchanged
    if it is scaled already)."""
    if isinstance(state, (ScaledLinearAttentionState, ScaledRecentKeys)):
        return state
    if isinstance(state, RecentKeys):
        return ScaledRecentKeys(keys=state.keys, values=state.values, window=state.window, position=state.position,
                                normalizer_keys=state.normalizer_keys, log_gates=state.log_gates,
                                log_scales=state.keys.new_zeros(state.keys.shape[:3]))
    return ScaledLinearAttentionState(kv=state.kv, normalizer=state.normalizer, position=state.position,
                                      log_scale=state.kv.new_zeros(state.kv.shape[:2]))


def to_plain_state(state: LinearState) -> LinearState:
    """The plain state of a ``Scaled`` one whose log scales are all 0 (sums of keys without
    scales); the scale is dropped."""
    if isinstance(state, ScaledRecentKeys):
        return RecentKeys(keys=state.keys, values=state.values, window=state.window, position=state.position,
                          normalizer_keys=state.normalizer_keys, log_gates=state.log_gates)
    if isinstance(state, ScaledLinearAttentionState):
        return LinearAttentionState(kv=state.kv, normalizer=state.normalizer, position=state.position)
    return state

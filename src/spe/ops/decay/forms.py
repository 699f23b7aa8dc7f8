"""The decay forms a linear kernel's ``log_decay`` takes, decoded once from its rank.

Letters: B = batch, L = length, H = num_heads, M = feature dimension of φ, G = gate channels.

One convention, GLA's and Mamba2's: the decay of step t multiplies the state carried from t − 1,
S_t = e^{G_t} S_{t−1} + φ(k_t) v_tᵀ (G_t ≤ 0), so key n weighs exp(Σ_{n<t≤m} G_t) at query m.
``log_decay`` names one of three forms by its rank, and :func:`decode_decay` turns it into a
named record once, at a kernel's entry; everything below reads the record, never the rank:

- :class:`ConstantDecay` (H,): RetNet's λ_h = log γ_h, G_t = λ_h (Sun et al. 2023);
- :class:`ScalarGate` (B, L, H): a gate per head and position (Mamba2, simple GLA), kept as
  (B, L, H, 1);
- :class:`ChannelGate` (B, L, H, M): a gate per feature channel of φ (GLA, Yang et al. 2024):
  S_t = diag(e^{G_t}) S_{t−1} + φ(k_t) v_tᵀ.

The kernels take λ = log γ rather than γ: a learned γ = sigmoid(logit) is then
λ = logsigmoid(logit), exact even for γ within 2⁻²⁴ of 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

__all__ = ["DECAY_MODES", "FLOOR_LOG_SCALE", "NO_DECAY", "ChannelGate", "ConstantDecay", "Decay", "ScalarGate",
           "check_decay_mode", "check_gates", "check_log_decay", "decay_form", "decode_decay", "given_form",
           "is_gate", "retnet_decay_logits", "retnet_log_decay"]

# The decays a model can ask for (ModelConfig.decay, --decay): none, RetNet's fixed γ_h,
# γ_h = sigmoid(logit_h) learned from RetNet's values, or a forget gate from the layer's input
# (spe.ops.decay.sums; spe.encodings.gates): per head and position, or per feature channel.
DECAY_MODES = ("none", "fixed", "learned", "gated", "gated-channel")
NO_DECAY = DECAY_MODES[0]  # a name of its own: "none" is also a positional encoding's


def check_decay_mode(decay: str) -> None:
    """Raises ValueError unless ``decay`` is one of :data:`DECAY_MODES`."""
    if decay not in DECAY_MODES:
        raise ValueError(f"decay must be one of {', '.join(DECAY_MODES)}, got {decay!r}")


# Log scale given to keys that hold nothing (padding, the zero key that pads a shifted
# sequence) in decayed sums: finite, so that e^{c_n − c_m} never meets −∞ − (−∞), and far
# below any real key's scale (FAVOR+ scales are O(100) nats), so it is never the maximum
# while a real key is in reach.
FLOOR_LOG_SCALE = -1e30


def retnet_log_decay(num_heads: int, *, dtype: torch.dtype = torch.float32,
                     device: torch.device | str | None = None) -> Tensor:
    """log γ_h for RetNet's fixed decays γ_h = 1 − 2^(−5−h), h = 0 … H − 1 (Sun et al. 2023,
    §2.2); (H,), computed in float64 (log1p) then cast.

    Raises:
        ValueError: if ``num_heads`` is not a positive int.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    h = torch.arange(num_heads, dtype=torch.float64)
    return torch.log1p(-torch.exp2(-5.0 - h)).to(dtype=dtype, device=device)


def retnet_decay_logits(num_heads: int) -> Tensor:
    """logit(γ_h) = log(2^{5+h} − 1) of RetNet's decays (H,) float32: the initial value of a
    learned decay γ = sigmoid(logit)."""
    h = torch.arange(num_heads, dtype=torch.float64)
    return torch.log(torch.exp2(5.0 + h) - 1.0).float()


def check_log_decay(log_decay: Tensor, num_heads: int) -> None:
    """Validates λ = log γ: a floating (H,) tensor with finite values ≤ 0 (γ ∈ (0, 1]).

    Raises:
        ValueError: naming the shape, dtype or values received.
    """
    if not isinstance(log_decay, Tensor) or not log_decay.is_floating_point() or log_decay.shape != (num_heads,):
        got = f"{log_decay.dtype} {tuple(log_decay.shape)}" if isinstance(log_decay, Tensor) else type(log_decay)
        raise ValueError(f"log_decay must be a floating ({num_heads},) tensor of log γ per head, got {got}")
    bad = ~torch.isfinite(log_decay) | (log_decay > 0)
    if bool(bad.any()):
        raise ValueError(f"log_decay holds log γ, finite and ≤ 0 (γ in (0, 1]), got {log_decay.tolist()}")


def is_gate(log_decay) -> bool:
    """True for a data-dependent gate ((B, L, H) or (B, L, H, M)), False for a constant decay
    (H,), None or anything the constant decay's check will refuse."""
    return isinstance(log_decay, Tensor) and log_decay.dim() > 1


def check_gates(log_decay: Tensor, shape: tuple[int, ...], *, channel: bool = True, key_log_scale: bool = False,
                normalizer_features: int | None = None) -> Tensor:
    """Validates a gate for queries of shape (B, L, H, M) and returns it as (B, L, H, G).

    Args:
        log_decay: (B, L, H) (G = 1), or (B, L, H, M) (G = M) with ``channel``; floating,
            finite and ≤ 0 (log of a factor in (0, 1]).
        shape: the queries' (B, L, H, M).
        channel: whether a gate per feature channel is allowed here.
        key_log_scale: the call has FAVOR+ key log scales (refused with a channel gate: the
            decayed running maximum would need a scale per channel).
        normalizer_features: M' of a separate normaliser, if any (a channel gate needs M' = M).

    Raises:
        ValueError: naming the shape and dtype received and the shapes allowed, the first
            value that is not finite or > 0, or a pair a channel gate does not combine with.
    """
    b, n, h, m = shape
    allowed = [(h,), (b, n, h)] + ([(b, n, h, m)] if channel else [])
    if not isinstance(log_decay, Tensor) or not log_decay.is_floating_point() or tuple(
            log_decay.shape) not in allowed[1:]:
        got = f"{log_decay.dtype} {tuple(log_decay.shape)}" if isinstance(log_decay, Tensor) else type(log_decay)
        names = ["(H,)", "(B, L, H)", "(B, L, H, M)"][:len(allowed)]
        listed = [f"{name} = {s}" for name, s in zip(names, allowed, strict=True)]
        listed = ", ".join(listed[:-1]) + " or " + listed[-1]
        raise ValueError(f"log_decay must be a floating tensor of shape {listed}, got {got}")
    bad = ~torch.isfinite(log_decay) | (log_decay > 0)
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"log_decay holds log gates, finite and ≤ 0, got {log_decay[first].item()} at index "
                         f"{first} ({int(bad.sum())} such values)")
    if log_decay.dim() == 4 and key_log_scale:
        raise ValueError("a gate per feature channel (B, L, H, M) does not combine with key_log_scale (FAVOR+ key "
                         "scales): give a gate per head and position (B, L, H)")
    if log_decay.dim() == 4 and normalizer_features not in (None, m):
        raise ValueError(f"a gate per feature channel (M = {m}) needs normaliser features of the same dimension, "
                         f"got M' = {normalizer_features}")
    return log_decay if log_decay.dim() == 4 else log_decay[..., None]


@dataclass(frozen=True)
class ConstantDecay:
    """RetNet's decay on the lag: key n weighs γ^{m−n} at query m (γ^{|m−n|} in an encoder).

    Attributes:
        log_decay: (H,) λ_h = log γ_h, finite and ≤ 0.
        name: ``constant``, how kernel specs and messages name the form.
    """

    log_decay: Tensor
    name: ClassVar[str] = "constant"


@dataclass(frozen=True)
class ScalarGate:
    """A data-dependent gate per head and position (Mamba2, simple GLA).

    Attributes:
        gates: (B, L, H, 1) log gates G_t ≤ 0 (one channel, broadcast over the features).
        name: ``gate``, how kernel specs and messages name the form.
    """

    gates: Tensor
    name: ClassVar[str] = "gate"


@dataclass(frozen=True)
class ChannelGate:
    """A data-dependent gate per feature channel of φ (GLA): S_t = diag(e^{G_t}) S_{t−1} + ….

    Attributes:
        gates: (B, L, H, M) log gates G_t ≤ 0.
        name: ``channel``, how kernel specs and messages name the form.
    """

    gates: Tensor
    name: ClassVar[str] = "channel"


Decay = ConstantDecay | ScalarGate | ChannelGate
# The form each rank of log_decay names, as given: (H,), (B, L, H), (B, L, H, M).
_FORM_BY_RANK: dict[int, type[Decay]] = {1: ConstantDecay, 3: ScalarGate, 4: ChannelGate}


def given_form(log_decay: Tensor | None) -> type[Decay] | None:
    """The form a ``log_decay`` names by its rank, as the caller gave it, unchecked: (H,)
    :class:`ConstantDecay`, (B, L, H) :class:`ScalarGate`, (B, L, H, M) :class:`ChannelGate`
    (even for M = 1, which :func:`decay_form` runs as a scalar gate); None for None or another
    rank (the kernels' checks refuse it). For what a caller accepts or refuses before a kernel
    decodes the tensor (kernel specs, messages)."""
    return None if log_decay is None else _FORM_BY_RANK.get(log_decay.dim())


def decode_decay(log_decay: Tensor | None, shape: tuple[int, ...], *, key_log_scale: bool = False,
                 normalizer_features: int | None = None) -> Decay | None:
    """``log_decay`` as its named form, checked: the one place its rank is read.

    Args:
        log_decay: None, (H,) λ = log γ, a gate (B, L, H) or (B, L, H, M).
        shape: the queries' (B, L, H, M).
        key_log_scale: the call has key log scales (refused with a channel gate).
        normalizer_features: M' of a separate normaliser, if any (a channel gate needs M).

    Returns:
        None, :class:`ConstantDecay`, :class:`ScalarGate` or :class:`ChannelGate`.

    Raises:
        ValueError: as :func:`check_log_decay` (rank 1 or not a tensor) and :func:`check_gates`
            (higher ranks).
    """
    if log_decay is None:
        return None
    if is_gate(log_decay):
        check_gates(log_decay, shape, key_log_scale=key_log_scale, normalizer_features=normalizer_features)
    else:
        check_log_decay(log_decay, shape[2])
    return decay_form(log_decay)


def decay_form(log_decay: Tensor) -> Decay:
    """The named form of a ``log_decay`` by its rank, unchecked (:func:`decode_decay` checks first;
    the float64 reference takes it as given): (H,) → :class:`ConstantDecay`, (B, L, H) →
    :class:`ScalarGate` (as (B, L, H, 1)), (B, L, H, M) → :class:`ChannelGate` (:class:`ScalarGate`
    when M = 1: one channel is a scalar gate)."""
    if log_decay.dim() == 1:
        return ConstantDecay(log_decay)
    gates = log_decay if log_decay.dim() == 4 else log_decay[..., None]
    return ScalarGate(gates) if gates.shape[-1] == 1 else ChannelGate(gates)

"""The decay of an attention layer, one object per mode behind one interface, as positional
encodings come through :class:`~spe.encodings.spec.LayerEncoding`.

:data:`DECAYS` maps each mode of :data:`~spe.ops.decay.DECAY_MODES` to its :class:`LayerDecay`:
``none``, ``fixed`` (RetNet's γ_h = 1 − 2^(−5−h)), ``learned`` (γ_h = sigmoid(logit_h)),
``gated`` (a :class:`~spe.encodings.gates.ScalarGate` of the input, Mamba2's and FoX's form) and
``gated-channel`` (a :class:`~spe.encodings.gates.ChannelGate`, GLA's). A layer looks its mode up
once and asks it for

- :meth:`LayerDecay.build`: the parameters, registered on the layer under the names of every
  earlier state dict (``decay_logit``; ``decay_gate.*``), so checkpoints load unchanged;
- :meth:`LayerDecay.log_decay`: what the kernels take as ``log_decay`` (:mod:`spe.ops.decay.forms`),
  for a whole sequence and a decoding step alike (a step's gate is the gate of its input);
- :attr:`LayerDecay.form`: the :data:`~spe.attention.kernels.DECAY_FORMS` key of that tensor
  (None without a decay), which :func:`~spe.attention.layer.check_decay` matches to the kernel.

The objects hold no state (one shared instance a mode): a layer keeps its mode's name
(``layer.decay``), so layers pickled before the registry existed still find their decay.
"""

from __future__ import annotations

from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from spe.encodings.gates import ChannelGate, ScalarGate
from spe.ops.decay import NO_DECAY, check_decay_mode, retnet_decay_logits, retnet_log_decay
from spe.ops.softmax import check_key_padding_mask

__all__ = ["DECAYS", "LayerDecay", "layer_decay"]


class LayerDecay:
    """One decay mode of an attention layer (module docstring).

    Attributes:
        name: the mode, a key of :data:`DECAYS`.
        form: ``constant`` ((H,) log γ), ``gate`` ((B, L, H)) or ``channel`` ((B, L, H, M)),
            the form of :meth:`log_decay`'s tensor; None for no decay.
        from_input: whether :meth:`log_decay` needs the layer's input x (a gate).
        sized_by_features: whether the parameters are sized by the kernel's feature
            dimension M (R with SPE), so the layer refuses codes of another R.
    """

    name: ClassVar[str]
    form: ClassVar[str | None] = None
    from_input: ClassVar[bool] = False
    sized_by_features: ClassVar[bool] = False

    def build(self, layer: nn.Module, *, d_model: int, num_heads: int, features: int | None,
              tied: int) -> None:
        """Registers the decay's parameters on ``layer`` (none by default).

        Args:
            layer: the attention layer that owns them.
            d_model: C, the size of the layer's input.
            num_heads: H.
            features: M, the kernel's feature dimension (head_dim, or R with SPE); None while an
                SPE layer does not know R yet.
            tied: consecutive feature channels that must share a gate (2 under RoPE).

        Raises:
            ValueError: when the decay cannot be built for these sizes.
        """

    def log_decay(self, layer: nn.Module, x: Tensor | None = None,
                  key_padding_mask: Tensor | None = None) -> Tensor | None:
        """The kernels' ``log_decay`` for ``layer`` on input x (B, L, C), or None without one."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class NoDecay(LayerDecay):
    """``none``: the kernel's sums unweighted."""

    name = NO_DECAY


class FixedDecay(LayerDecay):
    """``fixed``: RetNet's γ_h = 1 − 2^(−5−h), computed, not stored (no state-dict key)."""

    name, form = "fixed", "constant"

    def log_decay(self, layer: nn.Module, x: Tensor | None = None,
                  key_padding_mask: Tensor | None = None) -> Tensor:
        """(H,) log γ_h, float32, on the device of the layer's projections."""
        return retnet_log_decay(layer.num_heads, device=layer.qkv.weight.device)


class LearnedDecay(LayerDecay):
    """``learned``: γ_h = sigmoid(``layer.decay_logit``_h), an (H,) parameter initialised at
    RetNet's values."""

    name, form = "learned", "constant"

    def build(self, layer: nn.Module, *, d_model: int, num_heads: int, features: int | None,
              tied: int) -> None:
        layer.decay_logit = nn.Parameter(retnet_decay_logits(num_heads))

    def log_decay(self, layer: nn.Module, x: Tensor | None = None,
                  key_padding_mask: Tensor | None = None) -> Tensor:
        """(H,) logsigmoid of the logits in float32: exact where sigmoid would round γ to 1."""
        return F.logsigmoid(layer.decay_logit.float())


class _InputGate(LayerDecay):
    """A forget gate computed from the layer's input by ``layer.decay_gate``."""

    from_input = True

    def log_decay(self, layer: nn.Module, x: Tensor | None = None,
                  key_padding_mask: Tensor | None = None) -> Tensor:
        """The gates (B, L, H) or (B, L, H, M) of x (B, L, C) in at least float32, 0 (keep the
        state) where ``key_padding_mask`` (B, L) is True.

        Raises:
            ValueError: without x, or for a mask that does not match x.
        """
        if x is None:
            raise ValueError(f"decay {self.name!r} is computed from the layer's input: pass x (B, L, C)")
        gates = layer.decay_gate(x)
        if key_padding_mask is not None:
            check_key_padding_mask(key_padding_mask, x)
            padding = key_padding_mask.view(*key_padding_mask.shape, *[1] * (gates.dim() - 2))
            gates = gates.masked_fill(padding, 0.0)
        return gates


class GatedDecay(_InputGate):
    """``gated``: one gate per head and position (:class:`~spe.encodings.gates.ScalarGate`)."""

    name, form = "gated", "gate"

    def build(self, layer: nn.Module, *, d_model: int, num_heads: int, features: int | None,
              tied: int) -> None:
        layer.decay_gate = ScalarGate(d_model, num_heads)


class ChannelGatedDecay(_InputGate):
    """``gated-channel``: one gate per feature channel of the kernel
    (:class:`~spe.encodings.gates.ChannelGate`), sized by M."""

    name, form, sized_by_features = "gated-channel", "channel", True

    def build(self, layer: nn.Module, *, d_model: int, num_heads: int, features: int | None,
              tied: int) -> None:
        if features is None:
            raise ValueError("decay 'gated-channel' with SPE gates the R channels of q̂ and k̂, so it is "
                             "built for one R: pass num_realizations")
        layer.decay_gate = ChannelGate(d_model, num_heads, features, tied=tied)


# Every mode, in the order of spe.ops.decay.DECAY_MODES.
DECAYS: dict[str, LayerDecay] = {
    d.name: d for d in (NoDecay(), FixedDecay(), LearnedDecay(), GatedDecay(), ChannelGatedDecay())}


def layer_decay(name: str) -> LayerDecay:
    """The registry entry of the decay mode ``name``.

    Raises:
        ValueError: for a name outside :data:`~spe.ops.decay.DECAY_MODES`.
    """
    check_decay_mode(name)
    return DECAYS[name]

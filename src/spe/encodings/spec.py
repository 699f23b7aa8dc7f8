"""What the package knows about one positional encoding: :class:`PositionalSpec`.

Each encoding's own file declares its spec (its name, where it acts, its builders, what it
needs from the kernel); :mod:`spe.encodings.registry` collects them. This module sits below
every encoding, so it imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

__all__ = ["PLACES", "PositionalSpec", "head_dim", "option"]

PLACES = ("tokens", "queries-keys", "scores", "features")


def option(default: Any, flag: str = "", *, flag_type: type | None = None, choices: tuple | None = None) -> Any:
    """A field of an encoding's options dataclass (see :attr:`PositionalSpec.options`).

    Args:
        default: the value a model config takes when the option is not given.
        flag: help text of the command-line flag ``--name-with-dashes`` the option gets
            (``spe train``); empty: none (the option is then set in a config file).
        flag_type: the flag's value type (``int``, ``float``, ``str``).
        choices: the values the flag accepts, if it is a choice.
    """
    return field(default=default, metadata={"flag": flag, "flag_type": flag_type, "choices": choices})


@dataclass(frozen=True)
class PositionalSpec:
    """What the rest of the package needs to know about one positional encoding.

    Attributes:
        name: the string used in configs and on the command line.
        acts_on: one of ``PLACES`` or None (no encoding).
        stochastic: draws a random code per forward pass (SPE: ``sinespe``, ``convspe``);
            such encodings take ``num_realizations`` and an optional gate.
        windowed_by_default: training gives it a sliding attention window of the training
            length unless told otherwise (docs/ablation.md).
        source: the reference, for tables and docs.
        model_module: ``(config) -> nn.Module``, the part built once per model: the token
            encoding (``x + pe``), the SPE code generator, or (a score encoding's) the SPE
            module whose exact kernel the layers read (``sinespe-exact``); None if there is none.
        layer_module: ``(config, causal) -> nn.Module``, the part each attention layer takes
            (its ``positional`` hook, :class:`~spe.attention.MultiHeadAttention`); None if there is none.
        positive_features: with a linear kernel it needs strictly positive features (RoPE's
            unrotated normaliser, RoFormer eq. 19, could be 0 with ReLU features; likewise any
            transform of the numerator only).
        scale_embeddings: token embeddings are multiplied by √C to match the scale of the
            encoding added to them (sinusoidal APE, Vaswani et al.).
        position_limit: ``(config) -> int | None``, the most positions a model with this
            encoding takes (learned embeddings, an L_max); None: any length.
        limit_text: what that limit is and which option sets it, for messages.
        needs_grid: encodes positions on a 2-D grid (``convspe-2d``): its code generator is
            called with ``grid=(Y, X)`` instead of positions, so only models that know their
            grid (the encoder classifier on images) take it.
        takes_gate: a score encoding that takes the layer's forget gate (``decay gated``) into
            its own scores (PaTH-FoX); other score encodings refuse it (:func:`~spe.attention.layer.check_decay`).
        causal_only: has no non-causal form (PaTH): encoder configs refuse it.
        options: the options dataclasses whose fields the encoding's builders read (declared
            in its file with :func:`option`, ``kw_only``, with a ``check_options(self)``
            raising ValueError on a bad value). Every model config inherits the fields of
            every registered options class (:data:`spe.encodings.registry.ENCODING_OPTIONS`),
            so configs and checkpoint headers keep them flat (``num_sines = 5``); a class
            may serve several encodings (the SPE options of ``sinespe`` and ``convspe``).
    """

    name: str
    acts_on: str | None
    stochastic: bool = False
    windowed_by_default: bool = False
    source: str = ""
    model_module: Callable[[Any], nn.Module] | None = None
    layer_module: Callable[[Any, bool], nn.Module] | None = None
    scale_embeddings: bool = False
    positive_features: bool = False
    needs_grid: bool = False
    position_limit: Callable[[Any], int | None] | None = None
    limit_text: str = ""
    options: tuple[type, ...] = ()
    takes_gate: bool = False
    causal_only: bool = False

    def build_model_module(self, config: Any) -> nn.Module | None:
        """The per-model module (token encoding or SPE code generator), or None."""
        return None if self.model_module is None else self.model_module(config)

    def build_layer_module(self, config: Any, *, causal: bool = True) -> nn.Module | None:
        """The per-layer module (SPE filter, rotation, score term or feature transform), or None."""
        return None if self.layer_module is None else self.layer_module(config, causal)

    def max_positions(self, config: Any) -> int | None:
        """The most positions a model of ``config`` takes with this encoding; None: any length."""
        return None if self.position_limit is None else self.position_limit(config)


def head_dim(config: Any) -> int:
    """E, the per-head size of a config with ``d_model`` and ``num_heads``."""
    return config.d_model // config.num_heads

"""What the package knows about one positional encoding: :class:`PositionalSpec`, and the one
protocol between an attention layer and its per-layer module: :class:`LayerEncoding`.

Each encoding's own file declares its spec (its name, where it acts, its builders, what it
needs from the kernel); :mod:`spe.encodings.registry` collects them. This module sits below
every encoding, so it imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from spe.ops.common.state import WrappedState

__all__ = ["HALF_DTYPES", "LAYER_ATTRIBUTES", "PLACES", "EncodingState", "FeatureEncoding", "KeepsFullPrecision",
           "LayerEncoding", "PositionalSpec", "ScoreEncoding", "head_dim", "option"]

# Floating dtypes narrower than float32: a cast of a whole model to one of them (``model.to(torch.bfloat16)``,
# ``.half()``) leaves the parameters of a :class:`KeepsFullPrecision` module as they were.
HALF_DTYPES = (torch.float16, torch.bfloat16)

PLACES = ("tokens", "queries-keys", "scores", "features")
# Where an attention layer keeps its positional module, by the module's kind (the state-dict
# prefix of its parameters: checkpoints name them so): an SPE filter, a rotation, a score
# encoding, a feature transform.
LAYER_ATTRIBUTES = ("spe_filter", "rotary", "score_encoding", "feature_transform")


class KeepsFullPrecision(nn.Module):
    """A module whose own floating parameters and buffers keep their dtype (float32, or float64 for
    tables of frequencies) when the module is cast to float16 or bfloat16.

    Frequencies, phases and clocks are multiplied by positions: rounded to bfloat16 (8 bits of
    mantissa), a frequency is off by up to 2⁻⁹ of itself, so a phase at position 1,000 is off by up to
    2 radians, and a half-precision product of frequency and position is worse. A module of such
    parameters (sinusoid frequencies, learned clocks and angles, convolution filters that run through an
    FFT, which has no bfloat16 form) derives from this class, so that ``model.to(torch.bfloat16)`` (or ``.half()``)
    casts the rest of the model and leaves these in float32; the modules compute their phases in
    float32 or float64 and hand queries, keys or features back in the dtype of their input. Casts to
    float64 (reference checks) and moves between devices apply as usual; the parameters' gradients
    follow their dtype.
    """

    def _apply(self, fn, recurse: bool = True):
        # detached aliases of the tensors before the cast: the cast replaces each parameter's data
        # (or swaps its tensor), so these still hold the full-precision values
        before = {name: t.detach() for name, t in (*self._parameters.items(), *self._buffers.items())
                  if t is not None and t.is_floating_point() and t.dtype not in HALF_DTYPES}
        super()._apply(fn, recurse)
        for name, old in before.items():
            is_parameter = name in self._parameters
            now = self._parameters[name] if is_parameter else self._buffers[name]
            if now is None or now.dtype not in HALF_DTYPES:
                continue
            kept = old.to(device=now.device)
            if not is_parameter:
                self._buffers[name] = kept
                continue
            with torch.no_grad():
                now.data = kept
            if now.grad is not None:
                now.grad = now.grad.to(kept.dtype)
        return self


class LayerEncoding(nn.Module):
    """The one protocol between :class:`~spe.attention.MultiHeadAttention` and its positional
    module: the layer calls these hooks and never asks which encoding it holds.

    Letters: B = batch, L = length, C = d_model, H = num_heads, E = query/key size (D, or R
    after an SPE code), M = feature size.

    A call (``forward``, ``step``, ``prefill``) runs:

    1. :meth:`prepare` on the layer's input x (B, L, C), the call's positions and the
       encoding's decoding state: returns the call's *context* (what the other hooks read:
       the positions by default, a learned clock (B, L, H) …) and the state after the call
       (None for a stateless encoding; the layer carries it in an :class:`EncodingState`);
    2. :meth:`encode_queries_keys` on the projected q, k (B, L, H, D) (an SPE code, a
       learned-time code …);
    3. the kernel's feature map, then :meth:`transform_features` on φ(q), φ(k) (softmax: on
       q and k) when ``transforms_features`` (RoPE, a transform of the features …);
    4. the kernel, with :meth:`score_term`'s term in softmax's scores when ``forms_scores``
       (relative terms, an SPE oracle: a :class:`~spe.attention.kernels.ScoreTerm`, whose
       ``attend`` forms softmax attention itself; an encoding that replaces attention
       altogether binds what it derived from x in :meth:`prepare` into the term it returns).

    Class attributes (what the layer checks at construction):
        layer_attribute: one of :data:`LAYER_ATTRIBUTES`, where the layer keeps the module.
        acts_on: one of :data:`PLACES`, for the kernel's ``accepts`` (``check_placement``).
        label: how messages name it.
        takes_code: queries and keys are encoded with the model's SPE code and come out of
            the code's size R (the layer's kernel dimension).
        transforms_features: :meth:`transform_features` acts (step 3).
        numerator_only: with a linear kernel the normaliser keeps the untransformed features
            (RoFormer eq. 19), which must then be strictly positive.
        channel_tie: channels a transform keeps together (RoPE's rotated pairs: 2), which a
            gate per feature channel then shares; a transform with 1 moves channels by
            position, so it takes no gate per channel.
        forms_scores: the encoding supplies softmax's scores (step 4): softmax only, no
            window, no positions (index distances), and no gate on the logits unless
            ``takes_gate``.
        takes_gate: a score-forming encoding that applies the layer's forget gate on the
            logits itself (``decay="gated"``; :meth:`score_term` gets it): an encoding that
            replaces softmax attention altogether and adds FoX's gate to it (PaTH-FoX).
        stateful: :meth:`prepare` returns a decoding state (a clock's τ): a layer's state
            from the second call on must carry it.
    """

    layer_attribute: ClassVar[str] = "spe_filter"
    acts_on: ClassVar[str] = "queries-keys"
    takes_code: ClassVar[bool] = False
    transforms_features: ClassVar[bool] = False
    numerator_only: ClassVar[bool] = True
    channel_tie: ClassVar[int] = 1
    forms_scores: ClassVar[bool] = False
    takes_gate: ClassVar[bool] = False
    stateful: ClassVar[bool] = False

    @property
    def label(self) -> str:
        """How messages name the module (its class name unless the class says otherwise)."""
        return type(self).__name__

    def prepare(self, x: Tensor, positions: Tensor | None, state: Any = None, *,
                key_padding_mask: Tensor | None = None) -> tuple[Any, Any]:
        """The call's context and the encoding's state after it.

        Args:
            x: (B, L, C) the layer's input (before the projections).
            positions: (L,) the positions of this call (given, or p … p + L − 1 when decoding
                from position p), or None where the layer has none to give; or (B, L)
                per-sequence times where the model gives them (``times=``: the onset clock's,
                :class:`~spe.encodings.sine.OnsetSPEFilter`).
            state: what the previous call returned (None: position 0).
            key_padding_mask: (B, L) bool, True at padding (non-causal layers).

        Returns:
            (context, state): here the positions and None (stateless).
        """
        return positions, None

    def encode_queries_keys(self, q: Tensor, k: Tensor, *, code: Any, context: Any) -> tuple[Tensor, Tensor]:
        """q, k (B, L, H, D) as the kernel's feature map receives them (here unchanged)."""
        return q, k

    def transform_features(self, features: Tensor, context: Any) -> Tensor:
        """φ(q) or φ(k) (B, L, H, M) transformed by position (``transforms_features``: here unchanged)."""
        return features

    def score_term(self, context: Any, log_decay: Tensor | None = None) -> Any:
        """The :class:`~spe.attention.kernels.ScoreTerm` the softmax kernel calls for this call
        (``forms_scores``), or None: here the module itself. An encoding that ``takes_gate`` gets
        the layer's gate (B, L, H) (or None) here and applies it itself; the kernel then gets none.
        A term with ``step`` and ``prefill`` keeps its own decoding cache in place of the kernel's."""
        return self if self.forms_scores else None

    def check_features(self, feature_dim: int, what: str) -> None:
        """Raises ValueError if the kernel's M (``feature_dim``, named ``what``: ``head_dim`` or
        ``num_features``) does not suit :meth:`transform_features` (here: any does)."""


class ScoreEncoding(LayerEncoding):
    """A :class:`LayerEncoding` that forms softmax's scores (relative terms in them, the SPE
    oracle): subclasses give ``attend`` and ``score_bias`` (:class:`~spe.attention.kernels.ScoreTerm`)
    and ``causal``."""

    layer_attribute: ClassVar[str] = "score_encoding"
    acts_on: ClassVar[str] = "scores"
    forms_scores: ClassVar[bool] = True


class FeatureEncoding(LayerEncoding):
    """A :class:`LayerEncoding` that transforms a linear kernel's features by position (rotations,
    permutations, re-weightings): ``forward(features (B, L, H, M), positions (L,)) -> (B, L, H, M')``,
    a class attribute ``numerator_only`` and ``label``, and optionally ``feature_dim`` (the M it
    was built for)."""

    layer_attribute: ClassVar[str] = "feature_transform"
    acts_on: ClassVar[str] = "features"
    transforms_features: ClassVar[bool] = True

    def transform_features(self, features: Tensor, context: Any) -> Tensor:
        return self(features, context)

    def check_features(self, feature_dim: int, what: str) -> None:
        built_for = getattr(self, "feature_dim", None)
        if built_for is not None and built_for != feature_dim:
            raise ValueError(f"{self.label} was built for {built_for} features but this kernel has "
                             f"{feature_dim} ({what})")


@dataclass(frozen=True)
class EncodingState(WrappedState):
    """A layer's decoding state with its positional module's own (a learned clock's τ): what
    :meth:`LayerEncoding.prepare` returned, beside the rest of the layer's state.

    Attributes:
        inner: the rest of the layer's state (the kernel's, or a short convolution's wrapping it).
        encoding: the positional module's state.
    """

    inner: Any
    encoding: Any

    def to(self, dtype) -> EncodingState:
        """A copy with the inner state's floating tensors cast to ``dtype`` (the encoding's own
        state keeps its dtype: a clock is float64 whatever the model's)."""
        return EncodingState(inner=self.inner.to(dtype), encoding=self.encoding)


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
        score_bytes: for an encoding that forms softmax's scores (``acts_on="scores"``), the
            bytes per element of the (B, H, L, L) scores that one forward pass without gradients
            holds at its peak (measured as peak resident memory on the CPU, float32): what
            ``spe evaluate`` estimates a length's memory with; 0 where its default path forms
            no L × L matrix (a flash-style kernel).
        pair_bytes: bytes per element of an (L, L, D) tensor such an encoding forms besides,
            shared by the batch and the heads (Shaw's relative values); 0: none.
        linear_from: the length from which the encoding's kernel takes a flash-style form that
            forms no L × L tensor (PaTH's :data:`~spe.ops.path.flash.FLASH_MIN_LENGTH`), so that
            ``score_bytes`` and ``pair_bytes`` apply below it only; None: at every length.
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
    score_bytes: float = 12.5
    pair_bytes: float = 0.0
    linear_from: int | None = None

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

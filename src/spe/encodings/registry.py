"""The positional-encoding registry: one entry per name, saying where the encoding acts.

Every other module asks this registry instead of keeping its own tuple of names: which
encodings draw a stochastic code (SPE), which add a term to the attention scores, which act
on tokens. Which attention kernels accept an encoding follows from where it acts
(``spe.attention.layer.ACCEPTS``).

Places an encoding acts (STYLE.md rule 2):

* ``"tokens"``: added to the token embeddings (absolute PE);
* ``"queries-keys"``: transforms queries and keys (SPE codes, rotations);
* ``"scores"``: a relative term added to q·k before the softmax (needs explicit scores);
* ``"features"``: transforms the kernel's features φ(q), φ(k) by position, after the feature
  map (LRPE, PermuteFormer, cosFormer): linear kernels only, as softmax has no features;
* ``None``: no positional encoding.

Each entry also builds its modules (``PositionalSpec.build_model_module`` /
``build_layer_module``) from any configuration object with the fields of
:class:`spe.models.ModelConfig` it reads (duck-typed: this module sits below ``models``):
token encodings and SPE code generators live once per model, rotations, SPE filters, score
terms and feature transforms once per attention layer. Feature transforms are sized by the
kernel's feature dimension, which they read as ``config.feature_dim``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import EllipsisType
from typing import Any

from torch import nn

from spe.encodings.absolute import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from spe.encodings.alibi import ALiBi
from spe.encodings.conv import ConvSPE
from spe.encodings.conv2d import ConvSPE2d
from spe.encodings.cosformer import CosFormerReweighting
from spe.encodings.filter import SPEFilter
from spe.encodings.lrpe import LRPE
from spe.encodings.music_relative import MusicRelativePosition
from spe.encodings.permute import PermuteFeatures
from spe.encodings.oracle import ExactSPEScores
from spe.encodings.rope import RotaryEncoding
from spe.encodings.shaw import ShawRelativePosition
from spe.encodings.sine import SineSPE

__all__ = ["EXACT_TWINS", "LAYER_KEYWORDS", "PLACES", "POSITIONAL_SPECS", "PositionalSpec", "positional_names",
           "positional_spec"]

PLACES = ("tokens", "queries-keys", "scores", "features")


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
            (see ``LAYER_KEYWORDS``); None if there is none.
        positive_features: with a linear kernel it needs strictly positive features (RoPE's
            unrotated normaliser, RoFormer eq. 19, could be 0 with ReLU features; LRPE's
            likewise).
        scale_embeddings: token embeddings are multiplied by √C to match the scale of the
            encoding added to them (sinusoidal APE, Vaswani et al.).
        needs_grid: encodes positions on a 2-D grid (``convspe-2d``): its code generator is
            called with ``grid=(Y, X)`` instead of positions, so only models that know their
            grid (the encoder classifier on images) take it.
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

    def build_model_module(self, config: Any) -> nn.Module | None:
        """The per-model module (token encoding or SPE code generator), or None."""
        return None if self.model_module is None else self.model_module(config)

    def build_layer_module(self, config: Any, *, causal: bool = True) -> nn.Module | None:
        """The per-layer module (SPE filter, rotation, score term or feature transform), or None."""
        return None if self.layer_module is None else self.layer_module(config, causal)

    @property
    def layer_keyword(self) -> str | None:
        """The :class:`~spe.attention.MultiHeadAttention` argument the layer module goes to."""
        return LAYER_KEYWORDS.get((self.acts_on, self.stochastic))


# Which MultiHeadAttention argument takes a layer module, by (where it acts, stochastic).
LAYER_KEYWORDS = {("queries-keys", True): "spe_filter", ("queries-keys", False): "rotary",
                  ("scores", False): "score_encoding", ("features", False): "feature_transform"}


def _head_dim(config: Any) -> int:
    return config.d_model // config.num_heads


def _sine(config: Any) -> nn.Module:
    return SineSPE(config.num_heads, _head_dim(config), config.num_realizations, config.num_sines,
                   frequency_init=config.frequency_init, noise=config.code_noise)


def _conv(config: Any) -> nn.Module:
    # An encoder (config.causal False) takes the centred filter where ConvSPE offers one; the
    # causal orientation's kernel also covers both signs of the lag, so it works there too.
    centred = not getattr(config, "causal", True) and "causal" in inspect.signature(ConvSPE).parameters
    return ConvSPE(config.num_heads, _head_dim(config), config.num_realizations, config.kernel_size,
                   **({"causal": False} if centred else {}))


def _conv2d(config: Any) -> nn.Module:
    return ConvSPE2d(config.num_heads, _head_dim(config), config.num_realizations, config.kernel_size)


def _lrpe(config: Any, causal: bool) -> nn.Module:
    return LRPE(config.num_heads, config.feature_dim, angles=config.lrpe_angles)


def _permute(config: Any, causal: bool) -> nn.Module:
    return PermuteFeatures(config.num_heads, config.feature_dim, seed=config.permute_seed)


def _cosformer(config: Any, causal: bool) -> nn.Module:
    max_length = config.cosformer_max_length
    return CosFormerReweighting(config.max_positions if max_length is None else max_length)


def _spe_filter(config: Any, causal: bool) -> nn.Module:
    return SPEFilter(config.num_heads, _head_dim(config), gated=config.gated, gate_init=config.gate_init,
                     impl=config.spe_impl)


def _exact_scores(config: Any, causal: bool) -> nn.Module:
    # The oracle's model module is SPE's own (_sine, _conv): same parameters, same initial values.
    return ExactSPEScores(config.num_heads, _head_dim(config), gated=config.gated, gate_init=config.gate_init,
                          causal=causal)


_EXACT_SOURCE = "Liutkus et al. 2021, eq. (8), (16)–(17), exact expectation"


POSITIONAL_SPECS: dict[str, PositionalSpec] = {spec.name: spec for spec in (
    PositionalSpec("ape", "tokens", source="sinusoidal, Vaswani et al. 2017", scale_embeddings=True,
                   model_module=lambda c: SinusoidalPositionalEncoding(c.d_model)),
    PositionalSpec("ape-learned", "tokens", source="trainable embeddings (GPT-style)",
                   model_module=lambda c: LearnedPositionalEmbedding(c.max_positions, c.d_model)),
    PositionalSpec("sinespe", "queries-keys", stochastic=True, windowed_by_default=True,
                   source="Liutkus et al. 2021, eq. (18)-(21)", model_module=_sine, layer_module=_spe_filter),
    PositionalSpec("convspe", "queries-keys", stochastic=True, windowed_by_default=True,
                   source="Liutkus et al. 2021, eq. (22)", model_module=_conv, layer_module=_spe_filter),
    PositionalSpec("convspe-2d", "queries-keys", stochastic=True, needs_grid=True,
                   source="Liutkus et al. 2021, eq. (22) with a 2-D filter (images)", model_module=_conv2d,
                   layer_module=_spe_filter),
    PositionalSpec("rope", "queries-keys", source="Su et al. 2021", positive_features=True,
                   layer_module=lambda c, causal: RotaryEncoding(c.rope_base)),
    PositionalSpec("shaw", "scores", source="Shaw et al. 2018, O(L²D) memory",
                   layer_module=lambda c, causal: ShawRelativePosition(_head_dim(c), c.max_distance, causal=causal)),
    PositionalSpec("music-relative", "scores", source="Huang et al. 2018, skewing, O(LD) memory",
                   layer_module=lambda c, causal: MusicRelativePosition(c.num_heads, _head_dim(c), c.max_distance,
                                                                        causal=causal)),
    PositionalSpec("alibi", "scores", source="Press et al. 2022",
                   layer_module=lambda c, causal: ALiBi(c.num_heads, causal=causal)),
    PositionalSpec("lrpe", "features", source="Qin et al. 2023 (TMLR), cosine form", positive_features=True,
                   layer_module=_lrpe),
    PositionalSpec("permute", "features", source="Chen 2021 (EMNLP), PermuteFormer", layer_module=_permute),
    PositionalSpec("cosformer", "features", source="Qin et al. 2022 (ICLR), attends within L_max only",
                   layer_module=_cosformer),
    # The SPE oracles: softmax attention with the scores SPE estimates (spe.encodings.oracle);
    # deterministic, O(L²) memory (plus O(L·P·D) for conv's band), for diagnosis.
    PositionalSpec("sinespe-exact", "scores", source=_EXACT_SOURCE, model_module=_sine, layer_module=_exact_scores),
    PositionalSpec("convspe-exact", "scores", source=_EXACT_SOURCE, model_module=_conv, layer_module=_exact_scores),
    PositionalSpec("none", None, source="no positional encoding"),
)}


# Each SPE oracle and the SPE whose parameters (and so whose checkpoints and preset options) it shares.
EXACT_TWINS = {"sinespe-exact": "sinespe", "convspe-exact": "convspe"}


def positional_spec(name: str) -> PositionalSpec:
    """The registry entry of ``name``.

    Raises:
        ValueError: if ``name`` is not registered (the message lists the registered names).
    """
    try:
        return POSITIONAL_SPECS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown positional encoding {name!r}; choose one of "
                         f"{', '.join(POSITIONAL_SPECS)}") from None


def positional_names(*, acts_on: str | None | EllipsisType = ..., stochastic: bool | None = None,
                     needs_grid: bool | None = None) -> tuple[str, ...]:
    """Registered names, optionally filtered by where they act, whether they draw a code and
    whether they need a 2-D grid.

    ``positional_names(acts_on="scores")`` gives the score encodings;
    ``positional_names(stochastic=True)`` the SPE variants (``needs_grid=False``: those of 1-D
    sequences). ``acts_on=None`` selects ``none``.
    """
    if acts_on is not ... and acts_on is not None and acts_on not in PLACES:
        raise ValueError(f"acts_on must be one of {', '.join(PLACES)} or None, got {acts_on!r}")
    return tuple(spec.name for spec in POSITIONAL_SPECS.values()
                 if (acts_on is ... or spec.acts_on == acts_on)
                 and (stochastic is None or spec.stochastic == stochastic)
                 and (needs_grid is None or spec.needs_grid == needs_grid))

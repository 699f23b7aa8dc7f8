"""The positional-encoding registry: one entry per name, saying where the encoding acts.

Every other module asks this registry instead of keeping its own tuple of names: which
encodings draw a stochastic code (SPE), which add a term to the attention scores, which act
on tokens. Which attention kernels accept an encoding follows from where it acts
(``spe.attention.layer.ACCEPTS``).

Places an encoding acts (encodings are classified by where they act; each kernel declares
the places it accepts, and an impossible pair is refused when the model is built):

* ``"tokens"``: added to the token embeddings (absolute PE);
* ``"queries-keys"``: transforms queries and keys (SPE codes, rotations);
* ``"scores"``: a relative term added to q·k before the softmax (needs explicit scores);
* ``"features"``: transforms the kernel's features φ(q), φ(k) by position, after the feature
  map (LRPE, PermuteFormer, cosFormer): linear kernels only, as softmax has no features;
* ``None``: no positional encoding.

Each encoding's file declares its :class:`~spe.encodings.spec.PositionalSpec` (``SPEC``, or
``SPECS`` for a family); this registry only lists them, in the order the command line shows.
A spec builds its modules (``build_model_module`` / ``build_layer_module``) from any
configuration object with the fields of :class:`spe.models.ModelConfig` it reads (duck-typed:
this package sits below ``models``):
token encodings and SPE code generators live once per model, rotations, SPE filters, score
terms and feature transforms once per attention layer. Feature transforms are sized by the
kernel's feature dimension, which they read as ``config.feature_dim``.
"""

from __future__ import annotations

from dataclasses import fields
from types import EllipsisType

from spe.encodings import absolute, alibi, conv, conv2d, cosformer, lrpe, music_relative, oracle, path, permute, rope, shaw, sine
from spe.encodings.spec import PLACES, PositionalSpec

__all__ = ["ENCODING_OPTIONS", "EXACT_TWINS", "PLACES", "POSITIONAL_SPECS", "PositionalSpec",
           "encoding_flags", "encodings_reading", "positional_help", "positional_names", "positional_spec"]

POSITIONAL_SPECS: dict[str, PositionalSpec] = {spec.name: spec for spec in (
    *absolute.SPECS, sine.SPEC, conv.SPEC, conv2d.SPEC, rope.SPEC, shaw.SPEC, music_relative.SPEC, alibi.SPEC,
    lrpe.SPEC, permute.SPEC, cosformer.SPEC, *oracle.SPECS, path.SPEC,
    PositionalSpec("none", None, source="no positional encoding"),
)}


# Every registered options class once, in registry order: the bases of every model config
# (spe.models.TrunkConfig), so that each encoding's options are flat config fields.
ENCODING_OPTIONS: tuple[type, ...] = tuple(dict.fromkeys(cls for spec in POSITIONAL_SPECS.values()
                                                         for cls in spec.options))


def encoding_flags() -> list[tuple[str, dict]]:
    """The command-line flags of the encodings' options: ``(name, argparse keywords)`` for each
    options field declared with a flag (:func:`~spe.encodings.spec.option`), e.g.
    ``("num_sines", {"type": int, "help": ...})``."""
    flags = []
    for cls in ENCODING_OPTIONS:
        for f in fields(cls):
            if f.metadata.get("flag"):
                keywords = {"type": f.metadata["flag_type"], "help": f.metadata["flag"]}
                if f.metadata.get("choices"):
                    keywords["choices"] = f.metadata["choices"]
                flags.append((f.name, keywords))
    return flags


def encodings_reading(option: str) -> tuple[str, ...]:
    """The registered encodings whose options classes (:attr:`PositionalSpec.options`) declare
    ``option``, in registry order: ``encodings_reading("spe_time")`` is ``("sinespe",
    "sinespe-exact")``; empty for a name no encoding declares (``d_model``, ``attention``)."""
    return tuple(spec.name for spec in POSITIONAL_SPECS.values()
                 if any(option in {f.name for f in fields(cls)} for cls in spec.options))


# Each SPE oracle and the SPE whose parameters (and so whose checkpoints and preset options) it shares.
EXACT_TWINS = {"sinespe-exact": "sinespe", "convspe-exact": "convspe"}


def positional_help() -> str:
    """The registered names grouped by where they act, for command-line help."""
    groups = {"tokens": "added to tokens", "queries-keys": "on queries and keys",
              "scores": "in softmax's scores", "features": "on a linear kernel's features"}
    parts = [f"{where}: {', '.join(positional_names(acts_on=place))}" for place, where in groups.items()]
    return "; ".join(parts) + "; none"


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

"""The positional-encoding registry: one entry per name, saying where the encoding acts.

Every other module asks this registry instead of keeping its own tuple of names: which
encodings draw a stochastic code (SPE), which add a term to the attention scores, which act
on tokens. Which attention kernels accept an encoding follows from where it acts
(``spe.attention.layer.ACCEPTS``).

Places an encoding acts (STYLE.md rule 2):

* ``"tokens"``: added to the token embeddings (absolute PE);
* ``"queries-keys"``: transforms queries and keys (SPE codes, rotations);
* ``"scores"``: a relative term added to q·k before the softmax (needs explicit scores);
* ``None``: no positional encoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import EllipsisType

__all__ = ["PLACES", "POSITIONAL_SPECS", "PositionalSpec", "positional_names", "positional_spec"]

PLACES = ("tokens", "queries-keys", "scores")


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
    """

    name: str
    acts_on: str | None
    stochastic: bool = False
    windowed_by_default: bool = False
    source: str = ""


POSITIONAL_SPECS: dict[str, PositionalSpec] = {spec.name: spec for spec in (
    PositionalSpec("ape", "tokens", source="sinusoidal, Vaswani et al. 2017"),
    PositionalSpec("ape-learned", "tokens", source="trainable embeddings (GPT-style)"),
    PositionalSpec("sinespe", "queries-keys", stochastic=True, windowed_by_default=True,
                   source="Liutkus et al. 2021, eq. (18)-(21)"),
    PositionalSpec("convspe", "queries-keys", stochastic=True, windowed_by_default=True,
                   source="Liutkus et al. 2021, eq. (22)"),
    PositionalSpec("rope", "queries-keys", source="Su et al. 2021"),
    PositionalSpec("shaw", "scores", source="Shaw et al. 2018, O(L²D) memory"),
    PositionalSpec("music-relative", "scores", source="Huang et al. 2018, skewing, O(LD) memory"),
    PositionalSpec("alibi", "scores", source="Press et al. 2022"),
    PositionalSpec("none", None, source="no positional encoding"),
)}


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


def positional_names(*, acts_on: str | None | EllipsisType = ..., stochastic: bool | None = None) -> tuple[str, ...]:
    """Registered names, optionally filtered by where they act and whether they draw a code.

    ``positional_names(acts_on="scores")`` gives the score encodings;
    ``positional_names(stochastic=True)`` the SPE variants. ``acts_on=None`` selects ``none``.
    """
    if acts_on is not ... and acts_on is not None and acts_on not in PLACES:
        raise ValueError(f"acts_on must be one of {', '.join(PLACES)} or None, got {acts_on!r}")
    return tuple(spec.name for spec in POSITIONAL_SPECS.values()
                 if (acts_on is ... or spec.acts_on == acts_on)
                 and (stochastic is None or spec.stochastic == stochastic))

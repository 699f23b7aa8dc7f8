"""Configuration of the encoder classifier (Long Range Arena): the trunk's options and a head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from spe.encodings.positions import require_positive
from spe.encodings.registry import positional_spec
from spe.models.trunk_config import TrunkConfig

__all__ = ["INTERACTIONS", "POOLINGS", "ClassifierConfig"]

POOLINGS = ("cls", "mean")
# Two-tower heads over the pooled documents u, v: LRA's "NLI" features [u, v, u·v, u − v], or [u, v].
INTERACTIONS = (None, "nli", "concat")


@dataclass
class ClassifierConfig(TrunkConfig):
    """Bidirectional encoder + pooling + MLP head (:class:`~spe.models.EncoderClassifier`).

    Every option of :class:`~spe.models.TrunkConfig` keeps its meaning (``vocab_size``,
    ``d_model``, ``positional``, ``attention``, ``gated``, ``num_realizations``,
    ``share_across_layers`` …). The positional encoding acts on tokens, on queries and keys
    (``ape``, ``ape-learned``, ``sinespe``, ``convspe``, ``convspe-2d`` with a ``grid``,
    ``rope``) or on the scores of softmax attention (``shaw``, ``music-relative`` …,
    the SPE oracles ``sinespe-exact`` and ``convspe-exact``; their attention takes the
    padding mask), or is ``none``.

    Attributes:
        num_classes: output classes (≥ 2).
        pooling: ``cls`` (the output at a CLS token prepended to every sequence, id
            ``cls_id``) or ``mean`` (the mean over real, unpadded positions).
        interaction: None (one sequence per example) or a two-tower head for pairs
            (Retrieval): ``nli`` classifies [u, v, u·v, u − v], ``concat`` [u, v], where u, v
            are the pooled encodings of the two documents by the same encoder. ``"none"`` is
            read as None (TOML has no null).
        grid: (Y, X) for images read row-major (L = Y·X, plus the CLS token): required by
            ``convspe-2d``, which encodes the 2-D offset; None for sequences. JSON and TOML
            lists are read as tuples.
        cls_id: the CLS token id (:data:`spe.lab.lra.data.CLS_ID`, reserved, never in the data).
        head_hidden: hidden units of the MLP head (LRA's ``mlp_dim``); 0 means ``d_ff``.
        max_distance: k, the clipping distance of ``shaw`` and ``music-relative`` (as
            :class:`~spe.models.ModelConfig`'s).

    Class attributes (facts about an encoder classifier, not options): ``causal`` False
    (every position sees the whole sequence), ``attention_window`` None (hence),
    ``tie_embeddings`` False (the head outputs classes, not tokens).

    Raises:
        ValueError: as :class:`~spe.models.TrunkConfig`; for ``convspe-2d`` without a grid,
            and any bad value of the attributes above.
    """

    causal: ClassVar[bool] = False
    attention_window: ClassVar[None] = None
    tie_embeddings: ClassVar[bool] = False

    num_classes: int = 2
    pooling: str = "cls"
    interaction: str | None = None
    grid: tuple[int, int] | None = None
    cls_id: int = 1
    head_hidden: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.grid, list):
            self.grid = tuple(self.grid)  # JSON and TOML give lists
        if self.interaction == "none":
            self.interaction = None
        super().__post_init__()
        spec = positional_spec(self.positional)
        if spec.needs_grid and self.grid is None:
            raise ValueError(f"positional {self.positional!r} encodes positions on a 2-D grid: give the "
                             "classifier the images' grid (height, width)")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if self.interaction not in INTERACTIONS:
            raise ValueError(f"interaction must be None, 'nli' or 'concat', got {self.interaction!r}")
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int) or self.num_classes < 2:
            raise ValueError(f"num_classes must be an integer ≥ 2, got {self.num_classes!r}")
        if self.grid is not None and (len(self.grid) != 2 or any(int(g) < 1 for g in self.grid)):
            raise ValueError(f"grid must be (height, width) of positive sizes, got {self.grid!r}")
        if not 0 <= self.cls_id < self.vocab_size:
            raise ValueError(f"cls_id must lie in [0, vocab_size={self.vocab_size}), got {self.cls_id}")
        if self.head_hidden < 0:
            raise ValueError(f"head_hidden must be ≥ 0 (0: d_ff), got {self.head_hidden}")

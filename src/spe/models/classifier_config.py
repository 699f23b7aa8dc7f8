"""Configuration of the encoder classifier (Long Range Arena): ModelConfig's fields and a head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from spe.encodings.registry import positional_spec
from spe.models.config import ModelConfig

__all__ = ["INTERACTIONS", "POOLINGS", "ClassifierConfig"]

POOLINGS = ("cls", "mean")
# Two-tower heads over the pooled documents u, v: LRA's "NLI" features [u, v, u·v, u − v], or [u, v].
INTERACTIONS = (None, "nli", "concat")


@dataclass
class ClassifierConfig(ModelConfig):
    """Bidirectional encoder + pooling + MLP head (:class:`~spe.models.EncoderClassifier`).

    Every field of :class:`~spe.models.ModelConfig` keeps its meaning (``vocab_size``,
    ``d_model``, ``positional``, ``attention``, ``gated``, ``num_realizations``,
    ``share_across_layers`` …); ``attention_window`` must stay None (an encoder sees the whole
    sequence) and ``tie_embeddings`` is unused. Score encodings (``shaw``, ``music-relative``,
    ``alibi``) are refused: the padding mask is not threaded through their own attention.

    Attributes:
        num_classes: output classes (≥ 2).
        pooling: ``cls`` (the output at a CLS token prepended to every sequence, id
            ``cls_id``) or ``mean`` (the mean over real, unpadded positions).
        interaction: None (one sequence per example) or a two-tower head for pairs
            (Retrieval): ``nli`` classifies [u, v, u·v, u − v], ``concat`` [u, v], where u, v
            are the pooled encodings of the two documents by the same encoder. ``"none"`` is
            read as None (TOML has no null).
        grid: (Y, X) for images read row-major (L = Y·X, plus the CLS token): required by
            ``convspe-2d``, which encodes the 2-D offset; None for sequences.
        cls_id: the CLS token id (:data:`spe.data.lra.CLS_ID`, reserved, never in the data).
        head_hidden: hidden units of the MLP head (LRA's ``mlp_dim``); 0 means ``d_ff``.
    """

    # the registry builds encoder variants (e.g. convSPE's centred filter) from this
    causal: ClassVar[bool] = False

    tie_embeddings: bool = False
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
        if positional_spec(self.positional).acts_on == "scores":
            raise ValueError(f"the encoder classifier does not take score encodings (got {self.positional!r}): "
                             "choose ape, ape-learned, sinespe, convspe, convspe-2d, rope or none")
        if self.attention_window is not None:
            raise ValueError(f"an encoder sees the whole sequence: attention_window must be None, got "
                             f"{self.attention_window}")
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


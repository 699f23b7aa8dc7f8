"""The language model's configuration: the trunk's options and the decoder's own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from spe.encodings.positions import require_positive
from spe.encodings.registry import POSITIONAL_SPECS
from spe.models.trunk_config import POSITIONALS, TrunkConfig

__all__ = ["ModelConfig", "decode_window"]


def decode_window(value: int | None, name: str = "window") -> int | None:
    """A sliding attention window option W in positions: 0 means the whole past (None).

    Args:
        value: None (keep what the model has), 0 (the whole past) or W > 0 positions.
        name: how the caller names the option in messages (``--window``, ``attention_window``).

    Returns:
        None for 0 (and for None), else W.

    Raises:
        ValueError: naming ``name`` and the value, unless it is None or an int ≥ 0 (bools refused).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be 0 (the whole past) or a positive number of positions, got {value!r}")
    return value or None


@dataclass
class ModelConfig(TrunkConfig):
    """Decoder-only language model configuration (:class:`~spe.models.DecoderLM`).

    Every option of :class:`~spe.models.TrunkConfig` (sizes, ``positional``, ``attention``,
    SPE options …), and:

    Attributes:
        tie_embeddings: share the token embedding with the output layer.
        max_distance: k, the clipping distance of ``shaw`` and ``music-relative``: relative
            positions |j − i| ≤ k have their own embedding, farther ones share the last.
        attention_window: W, causal sliding-window attention: each position attends to the
            last W positions only (itself included); None: the whole past. Set to the
            training length, it changes nothing inside the trained range and keeps every
            query/key lag a relative encoding sees beyond it within the trained lags
            (docs/ablation.md); can be changed at test time
            (:meth:`~spe.DecoderLM.set_attention_window`). 0 means None (config files have
            no null). Not with score encodings.

    Raises:
        ValueError: as :class:`~spe.models.TrunkConfig`; for ``convspe-2d`` (it needs an
            image grid, which a language model has not), a ``max_distance`` that is not a
            positive integer, or a bad ``attention_window`` (not a positive integer, or with
            a score encoding).
    """

    causal: ClassVar[bool] = True

    tie_embeddings: bool = True
    attention_window: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if POSITIONAL_SPECS[self.positional].needs_grid:
            raise ValueError(f"positional {self.positional!r} encodes positions on a 2-D grid: use it with the "
                             "encoder classifier on images (spe.models.ClassifierConfig with a grid)")
        self.attention_window = decode_window(self.attention_window, "attention_window")  # TOML has no null
        if self.attention_window is not None and POSITIONALS[self.positional] == "scores":
            raise ValueError(f"attention_window cannot be combined with positional {self.positional!r}, "
                             "which forms its own attention scores")

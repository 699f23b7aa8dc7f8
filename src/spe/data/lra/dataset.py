"""Classification datasets for the Long Range Arena tasks: padded token ids, lengths, labels.

Letters: N = examples, L = padded length (tokens).

Every LRA loader of :mod:`spe.data` returns one of the two containers below, so a training
loop consumes any task the same way. Token ids share one convention: 0 = padding,
1 = CLS (reserved, never in the data; prepend it for CLS pooling), content from 2 on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["CLS_ID", "CONTENT_OFFSET", "PAD_ID", "PairDataset", "SequenceDataset", "pad_sequences"]

log = logging.getLogger(__name__)

PAD_ID = 0
CLS_ID = 1
CONTENT_OFFSET = 2  # first id of the data's own symbols


@dataclass(frozen=True)
class SequenceDataset:
    """One sequence per example (ListOps, Text, Image).

    Attributes:
        tokens: (N, L) int64 ids, :data:`PAD_ID` after each example's end.
        lengths: (N,) int64 true lengths (tokens before the padding), ≥ 1.
        labels: (N,) int64 classes in [0, num_classes).
        vocab_size: ids are in [0, vocab_size), padding and CLS included.
        num_classes: number of classes.
        grid: (height, width) when the sequence is an image read row-major (L = height·width), else None.
    """

    tokens: Tensor
    lengths: Tensor
    labels: Tensor
    vocab_size: int
    num_classes: int
    grid: tuple[int, int] | None = None

    @property
    def mask(self) -> Tensor:
        """(N, L) bool, True at real tokens, False at padding."""
        return torch.arange(self.tokens.shape[1])[None, :] < self.lengths[:, None]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def subset(self, index: Tensor | Sequence[int]) -> SequenceDataset:
        """The examples at ``index`` (a 1-D index tensor or list), same vocabulary and classes."""
        index = torch.as_tensor(index, dtype=torch.long)
        return SequenceDataset(self.tokens[index], self.lengths[index], self.labels[index],
                               self.vocab_size, self.num_classes, self.grid)


@dataclass(frozen=True)
class PairDataset:
    """Two sequences per example (Retrieval: does document 1 relate to document 2?).

    Attributes:
        tokens1, tokens2: (N, L) int64 ids of the first and second documents, padded with :data:`PAD_ID`.
        lengths1, lengths2: (N,) int64 true lengths.
        labels: (N,) int64 classes in [0, num_classes) (Retrieval: 1 = related, 0 = not).
        vocab_size: ids are in [0, vocab_size).
        num_classes: number of classes.
    """

    tokens1: Tensor
    lengths1: Tensor
    tokens2: Tensor
    lengths2: Tensor
    labels: Tensor
    vocab_size: int
    num_classes: int

    @property
    def mask1(self) -> Tensor:
        """(N, L) bool, True at the first documents' real tokens."""
        return torch.arange(self.tokens1.shape[1])[None, :] < self.lengths1[:, None]

    @property
    def mask2(self) -> Tensor:
        """(N, L) bool, True at the second documents' real tokens."""
        return torch.arange(self.tokens2.shape[1])[None, :] < self.lengths2[:, None]

    def __len__(self) -> int:
        return self.tokens1.shape[0]

    def subset(self, index: Tensor | Sequence[int]) -> PairDataset:
        """The pairs at ``index``."""
        index = torch.as_tensor(index, dtype=torch.long)
        return PairDataset(self.tokens1[index], self.lengths1[index], self.tokens2[index],
                           self.lengths2[index], self.labels[index], self.vocab_size, self.num_classes)


def pad_sequences(sequences: Sequence[Sequence[int]], length: int | None = None, *,
                  what: str = "sequences") -> tuple[Tensor, Tensor]:
    """Right-pads (and, beyond ``length``, truncates) id sequences.

    Args:
        sequences: N sequences of ids (lists, bytes or 1-D arrays).
        length: L, the padded length; None pads to the longest sequence.
        what: a name for the log message about truncation.

    Returns:
        tokens (N, L) int64 padded with :data:`PAD_ID`, lengths (N,) int64 (after truncation).

    Raises:
        ValueError: if ``length`` is not positive, or a sequence is empty.
    """
    if length is not None and (isinstance(length, bool) or int(length) != length or length < 1):
        raise ValueError(f"length must be a positive integer or None, got {length!r}")
    sizes = [len(s) for s in sequences]
    if 0 in sizes:
        raise ValueError(f"{what}: example {sizes.index(0)} is empty")
    width = length if length is not None else max(sizes, default=1)
    tokens = torch.full((len(sizes), width), PAD_ID, dtype=torch.long)
    for i, seq in enumerate(sequences):
        row = torch.as_tensor(list(seq[:width]) if isinstance(seq, (bytes, bytearray)) else seq[:width],
                              dtype=torch.long)
        tokens[i, : row.numel()] = row
    cut = sum(size > width for size in sizes)
    if cut:
        log.info("%s: truncated %d of %d examples to %d tokens", what, cut, len(sizes), width)
    return tokens, torch.tensor([min(size, width) for size in sizes], dtype=torch.long)

"""Classification datasets for the Long Range Arena tasks: padded token ids, lengths, labels.

Letters: N = examples, L = padded length (tokens).

Every LRA loader of :mod:`spe.lab.lra.data` returns one of the two containers below, so a training
loop consumes any task the same way. Token ids share one convention: 0 = padding,
1 = CLS (reserved, never in the data; prepend it for CLS pooling), content from 2 on.
Tokens are stored in the smallest integer type that holds the vocabulary (LRA's 96,000 ListOps
expressions of up to 6,000 symbols would take 4.6 GB as int64); :meth:`SequenceDataset.batch`
returns int64.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "BYTE_VOCAB",
    "CLS_ID",
    "CONTENT_OFFSET",
    "PAD_ID",
    "PairDataset",
    "SequenceDataset",
    "byte_tokens",
    "compact_dtype",
    "pack",
    "pad_sequences",
    "regular_file",
    "regular_files",
    "split_off",
]

log = logging.getLogger(__name__)

PAD_ID = 0
CLS_ID = 1
CONTENT_OFFSET = 2  # first id of the data's own symbols


@dataclass(frozen=True)
class SequenceDataset:
    """One sequence per example (ListOps, Text, Image).

    Attributes:
        tokens: (N, L) integer ids (uint8/int16/int32, see :func:`compact_dtype`), :data:`PAD_ID`
            after each example's end.
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

    def batch(self, index: Tensor | Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (B, L) int64, lengths (B,), labels (B,) of the examples at ``index``."""
        index = torch.as_tensor(index, dtype=torch.long)
        return self.tokens[index].long(), self.lengths[index], self.labels[index]

    def subset(self, index: Tensor | Sequence[int]) -> SequenceDataset:
        """The examples at ``index`` (a 1-D index tensor or list), same vocabulary and classes."""
        index = torch.as_tensor(index, dtype=torch.long)
        return SequenceDataset(self.tokens[index], self.lengths[index], self.labels[index],
                               self.vocab_size, self.num_classes, self.grid)


@dataclass(frozen=True)
class PairDataset:
    """Two sequences per example (Retrieval: does document 1 relate to document 2?).

    Attributes:
        tokens1, tokens2: (N, L) integer ids of the first and second documents (compact type, as
            :class:`SequenceDataset`), padded with :data:`PAD_ID`.
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

    def batch(self, index: Tensor | Sequence[int]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """tokens1 (B, L) int64, lengths1, tokens2 (B, L) int64, lengths2, labels at ``index``."""
        index = torch.as_tensor(index, dtype=torch.long)
        return (self.tokens1[index].long(), self.lengths1[index], self.tokens2[index].long(),
                self.lengths2[index], self.labels[index])

    def subset(self, index: Tensor | Sequence[int]) -> PairDataset:
        """The pairs at ``index``."""
        index = torch.as_tensor(index, dtype=torch.long)
        return PairDataset(self.tokens1[index], self.lengths1[index], self.tokens2[index],
                           self.lengths2[index], self.labels[index], self.vocab_size, self.num_classes)


def compact_dtype(vocab_size: int) -> torch.dtype:
    """The smallest of uint8, int16, int32 that holds ids in [0, vocab_size)."""
    for dtype in (torch.uint8, torch.int16, torch.int32):
        if vocab_size - 1 <= torch.iinfo(dtype).max:
            return dtype
    return torch.int64


def pack(flat: np.ndarray, lengths: np.ndarray, length: int | None, vocab_size: int, *,
         what: str = "sequences") -> tuple[Tensor, Tensor]:
    """Pads concatenated sequences into rows (truncating beyond ``length``), vectorised.

    Args:
        flat: all ids, sequence after sequence.
        lengths: (N,) sizes of the sequences in ``flat``, each ≥ 1.
        length: L, the padded length; None pads to the longest sequence.
        vocab_size: chooses the storage type (:func:`compact_dtype`).
        what: a name for error and log messages.

    Returns:
        tokens (N, L) padded with :data:`PAD_ID`, lengths (N,) int64 after truncation.

    Raises:
        ValueError: if ``length`` is not a positive integer or a sequence is empty.
    """
    if length is not None and (isinstance(length, bool) or int(length) != length or length < 1):
        raise ValueError(f"length must be a positive integer or None, got {length!r}")
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and lengths.min() < 1:
        raise ValueError(f"{what}: example {int(np.argmin(lengths))} is empty")
    width = int(length) if length is not None else int(lengths.max(initial=1))
    kept = np.minimum(lengths, width)
    flat = np.asarray(flat)
    if (kept < lengths).any():  # drop the truncated tails
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        flat = flat[np.arange(flat.size) - starts < width]
    dtype = torch.empty(0, dtype=compact_dtype(vocab_size)).numpy().dtype
    tokens = np.zeros((lengths.size, width), dtype=dtype)
    # Row-major boolean assignment fills row after row, i.e. in the order of ``flat``.
    tokens[np.arange(width)[None, :] < kept[:, None]] = flat
    tokens = torch.from_numpy(tokens)
    cut = int((lengths > width).sum())
    if cut:
        log.info("%s: truncated %d of %d examples to %d tokens", what, cut, lengths.size, width)
    return tokens, torch.from_numpy(kept)


def pad_sequences(sequences: Sequence[Sequence[int]], length: int | None, vocab_size: int, *,
                  what: str = "sequences") -> tuple[Tensor, Tensor]:
    """:func:`pack` for a list of id sequences (lists or 1-D arrays)."""
    arrays = [np.asarray(s) for s in sequences]
    flat = np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, dtype=np.int64)
    return pack(flat, np.array([a.size for a in arrays], dtype=np.int64), length, vocab_size, what=what)


BYTE_VOCAB = CONTENT_OFFSET + 256  # byte b has id b + CONTENT_OFFSET


def byte_tokens(documents: Sequence[bytes], length: int | None, *,
                what: str = "documents") -> tuple[Tensor, Tensor]:
    """Byte-level ids (byte b → b + 2, vocabulary 258), padded or truncated to ``length``.

    Returns:
        tokens (N, L) int16, lengths (N,) int64.

    Raises:
        ValueError: if a document is empty or ``length`` is not positive.
    """
    flat = np.frombuffer(b"".join(documents), dtype=np.uint8).astype(np.int16) + CONTENT_OFFSET
    return pack(flat, np.array([len(d) for d in documents], dtype=np.int64), length, BYTE_VOCAB, what=what)


def regular_file(path: str | os.PathLike, what: str, layout: str) -> Path:
    """``path`` if it is a regular file (or a link to one), checked without opening it.

    Opening a FIFO blocks until something writes to it, and a folder or device is no data file.

    Args:
        path: the file a reader is about to open.
        what: the reader's name for messages (``ListOps``, ``AAN``, ``CIFAR-10``).
        layout: the expected layout, quoted in messages.

    Raises:
        FileNotFoundError: if nothing is there.
        ValueError: if it is a folder, FIFO, socket or device.
    """
    from spe.lab.outputs import display_name

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what}: no file {display_name(path)}; expected {layout}")
    if not path.is_file():
        raise ValueError(f"{what}: {display_name(path)} is not a regular file (a folder, FIFO or device); "
                         f"expected {layout}")
    return path


def regular_files(paths: Sequence[Path], what: str) -> list[Path]:
    """The regular files (or links to them) among ``paths``; the others are skipped with one warning.

    A FIFO would block the reader, and a folder or device is no document: the warning counts
    them and names the first few.
    """
    from spe.lab.outputs import shown_names

    regular = {p: p.is_file() for p in paths}
    kept = [p for p, ok in regular.items() if ok]
    skipped = [p for p, ok in regular.items() if not ok]
    if skipped:
        warnings.warn(f"{what}: skipped {len(skipped)} path(s) that are not regular files (folders, FIFOs, "
                      f"devices): {shown_names(skipped)}", stacklevel=2)
    return kept


def split_off(dataset: SequenceDataset | PairDataset, fraction: float, *, seed: int = 0):
    """Splits a dataset in two at random, per class (for a validation split where a task has none).

    Args:
        dataset: N examples.
        fraction: share of each class that goes to the second part, in (0, 1).
        seed: seeds the permutation.

    Returns:
        (rest, held_out), same type as ``dataset``.

    Raises:
        ValueError: if ``fraction`` is outside (0, 1).
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"split_off: fraction must be in (0, 1), got {fraction!r}")
    g = torch.Generator().manual_seed(seed)
    held = []
    for c in torch.unique(dataset.labels).tolist():
        members = torch.nonzero(dataset.labels == c).flatten()
        members = members[torch.randperm(members.numel(), generator=g)]
        held.append(members[: round(fraction * members.numel())])
    held = torch.cat(held).sort().values
    rest = torch.ones(len(dataset), dtype=torch.bool)
    rest[held] = False
    return dataset.subset(torch.nonzero(rest).flatten()), dataset.subset(held)

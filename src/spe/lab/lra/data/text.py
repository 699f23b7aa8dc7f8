"""LRA Text: byte-level IMDB sentiment classification from the ``aclImdb`` folder layout.

Letters: N = reviews, L = bytes kept per review.

Layout (Maas et al. 2011, as unpacked): ``aclImdb/{train,test}/{pos,neg}/*.txt``, one review
per file (the ``unsup`` folder and the other files are ignored; a ``*.txt`` that is not a
regular file, such as a folder or a FIFO, is skipped with a warning). Labels: neg = 0, pos = 1.
LRA has no validation split for this task (:func:`spe.lab.lra.data.dataset.split_off` makes one).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from spe.lab.lra.data.dataset import BYTE_VOCAB, SequenceDataset, byte_tokens, regular_files

__all__ = ["IMDB_CLASSES", "load_imdb"]

IMDB_CLASSES = ("neg", "pos")
_LAYOUT = "aclImdb/{train,test}/{pos,neg}/*.txt (one review per file)"


def load_imdb(folder: str | os.PathLike, *, max_length: int = 1000,
              splits: tuple[str, ...] = ("train", "test")) -> dict[str, SequenceDataset]:
    """Reads IMDB reviews as bytes.

    Args:
        folder: the ``aclImdb`` folder (holding ``train/`` and ``test/``).
        max_length: L in bytes; longer reviews are truncated (LRA's code: 1,000; its paper: 4,000).
        splits: which of ``train``, ``test`` to read.

    Returns:
        split → :class:`SequenceDataset` (byte ids b + 2, vocab_size 258, num_classes 2), files in
        sorted order within each class, neg before pos.

    Raises:
        FileNotFoundError: if the folder or a ``split/class`` folder is missing (naming the layout).
        ValueError: if a class folder holds no regular ``.txt`` file, or a review is empty (naming it).

    Warns:
        UserWarning: counting and naming the ``*.txt`` paths skipped because they are not
            regular files (folders, FIFOs, devices: a FIFO would block the read).
    """
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"IMDB: no folder {root}; expected {_LAYOUT}")
    out = {}
    for split in splits:
        documents, labels = [], []
        for label, name in enumerate(IMDB_CLASSES):
            sub = root / split / name
            if not sub.is_dir():
                raise FileNotFoundError(f"IMDB: no folder {sub}; expected {_LAYOUT}")
            files = regular_files(sorted(sub.glob("*.txt")), f"IMDB {sub}")
            if not files:
                raise ValueError(f"IMDB: {sub} holds no .txt review; expected {_LAYOUT}")
            for f in files:
                text = f.read_bytes()
                if not text:
                    raise ValueError(f"IMDB: {f} is empty")
                documents.append(text)
            labels += [label] * len(files)
        tokens, lengths = byte_tokens(documents, max_length, what=f"IMDB {split}")
        out[split] = SequenceDataset(tokens, lengths, torch.tensor(labels), BYTE_VOCAB, len(IMDB_CLASSES))
    return out

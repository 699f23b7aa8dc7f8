"""LRA Retrieval: byte-level document matching on the ACL Anthology Network (AAN) pairs.

Letters: N = pairs, L = bytes kept per document.

Layout (LRA's release): ``new_aan_pairs.train.tsv``, ``new_aan_pairs.eval.tsv``,
``new_aan_pairs.test.tsv``, no header, one pair per line, five tab-separated fields
``label  id1  id2  text1  text2``; the label is 0 or 1 (written ``1`` or ``1.0``: LRA reads it
as a float; other spellings of a float, such as ``1e0`` or ``+1``, are refused); quotes are plain
characters (LRA reads the files without quote handling).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from spe.lab.lra.data.dataset import BYTE_VOCAB, PairDataset, byte_tokens, regular_file

__all__ = ["AAN_FILES", "load_aan", "read_aan_tsv"]

AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv",
             "test": "new_aan_pairs.test.tsv"}
_LAYOUT = ("a folder with new_aan_pairs.{train,eval,test}.tsv, each line 'label<TAB>id1<TAB>id2<TAB>"
           "text1<TAB>text2' without header, label 0 or 1")
_LABEL = re.compile(rb"[ \t]*([01])(?:\.0*)?[ \t]*")  # ASCII 0 or 1, optionally as LRA's float 1.0


def read_aan_tsv(path: str | os.PathLike) -> tuple[list[int], list[bytes], list[bytes]]:
    """Reads one AAN pairs file.

    Returns:
        labels, first documents (bytes), second documents (bytes), in file order.

    Raises:
        FileNotFoundError: if the file is missing.
        ValueError: naming the file and line of a row without five fields, a label other than
            0/1, or an empty document; if the file holds no pair or is not a regular file.
    """
    path = regular_file(path, "AAN", _LAYOUT)
    labels, first, second = [], [], []
    for line, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        raw = raw.rstrip(b"\r")
        if not raw:
            continue
        fields = raw.split(b"\t")
        if len(fields) != 5:
            raise ValueError(f"{path}:{line}: expected 5 tab-separated fields "
                             f"(label, id1, id2, text1, text2), got {len(fields)}")
        label = _LABEL.fullmatch(fields[0])
        if label is None:
            raise ValueError(f"{path}:{line}: label must be 0 or 1 (or 0.0, 1.0), got {fields[0][:20]!r}")
        if not fields[3] or not fields[4]:
            raise ValueError(f"{path}:{line}: empty document text")
        labels.append(int(label[1]))
        first.append(fields[3])
        second.append(fields[4])
    if not labels:
        raise ValueError(f"{path}: no pairs; expected {_LAYOUT}")
    return labels, first, second


def load_aan(folder: str | os.PathLike, *, max_length: int = 4000,
             splits: tuple[str, ...] = ("train", "val", "test")) -> dict[str, PairDataset]:
    """Reads the AAN pairs as bytes.

    Args:
        folder: holds the three ``new_aan_pairs.*.tsv`` files.
        max_length: L, bytes kept per document (LRA: 4,000).
        splits: which of ``train``, ``val`` (the ``eval`` file), ``test`` to read.

    Returns:
        split → :class:`PairDataset` (byte ids b + 2, vocab_size 258, num_classes 2).

    Raises:
        FileNotFoundError, ValueError: as :func:`read_aan_tsv`, or if the folder is missing.
    """
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"AAN: no folder {root}; expected {_LAYOUT}")
    out = {}
    for split in splits:
        labels, first, second = read_aan_tsv(root / AAN_FILES[split])
        t1, n1 = byte_tokens(first, max_length, what=f"AAN {split} text1")
        t2, n2 = byte_tokens(second, max_length, what=f"AAN {split} text2")
        out[split] = PairDataset(t1, n1, t2, n2, torch.tensor(labels), BYTE_VOCAB, 2)
    return out

"""Embedded stand-ins for LRA's Text, Retrieval and Image tasks, built from data that ships inside
installed packages, so every task runs on a machine without downloads. They are proxies with
the benchmark's input formats and lengths, not the benchmark: their numbers are not LRA's.

Letters: N = examples, L = tokens per example.

* Text (:func:`text_proxy`): byte-level classification of a Palestrina mass movement (Humdrum
  ``**kern`` files of music21's corpus, 1,297 distinct documents) into its section of the Ordinary — Kyrie,
  Gloria, Credo, Sanctus, Benedictus, Agnus Dei — from the notes alone: reference records and
  comments (``!`` lines, which name the movement) are removed. Six balanced classes.
* Retrieval (:func:`retrieval_proxy`): pairs of such movements, label 1 when both come from the
  same mass (``!!!OPR`` record, ~100 masses), 0 otherwise; balanced; the masses are split
  between train, val and test, so test pairs come from masses never seen in training.
* Image (:func:`image_proxy`): scikit-learn's 1,797 handwritten digits (8 × 8, 17 grey levels),
  each pixel repeated on a 4 × 4 block to 32 × 32 and its level scaled to 0–255 → 1,024 tokens
  of 256 levels, as CIFAR-10 in LRA. Ten balanced classes.

Splits are seeded and stratified (80 / 10 / 10 %). Building each takes about a second (no cache needed).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from spe.lab.lra.data.dataset import BYTE_VOCAB, PairDataset, SequenceDataset, byte_tokens
from spe.lab.lra.data.image import image_dataset

__all__ = ["MASS_SECTIONS", "image_proxy", "palestrina_movements", "retrieval_proxy", "text_proxy"]

MASS_SECTIONS = ("Kyrie", "Gloria", "Credo", "Sanctus", "Benedictus", "Agnus")
SPLITS = ("train", "val", "test")
_FRACTIONS = (0.8, 0.1, 0.1)


def palestrina_movements() -> list[tuple[bytes, int, str]]:
    """The Palestrina movements of music21's corpus, without ``!`` lines.

    Returns:
        (document bytes, section index into :data:`MASS_SECTIONS`, mass title) per distinct
        document (1,297 of the 1,318 files), in file-name order.

    Raises:
        ImportError: if music21 (the ``music`` extra) is not installed.
        FileNotFoundError: if its corpus has no ``palestrina`` folder.
    """
    try:
        import music21
    except ImportError as err:
        raise ImportError("the LRA Text and Retrieval proxies read music21's corpus: "
                          "pip install 'spe[music]'") from err
    folder = Path(music21.__file__).parent / "corpus" / "palestrina"
    files = sorted(folder.glob("*.krn"))
    if not files:
        raise FileNotFoundError(f"no Palestrina .krn files in {folder} (music21 {music21.__version__})")
    out, seen = [], set()
    for f in files:
        section = f.stem.split("_")[0]
        if section not in MASS_SECTIONS:
            continue
        lines = f.read_bytes().splitlines()
        title = next((ln[7:].strip().decode("utf-8", "replace")
                      for ln in lines if ln.startswith(b"!!!OPR:")), "")
        body = b"\n".join(ln for ln in lines if not ln.startswith(b"!"))
        if body not in seen:  # 21 files repeat another's notes (a da capo section): keep the first
            seen.add(body)
            out.append((body, MASS_SECTIONS.index(section), title or f.stem))
    return out


def _balanced_splits(labels: Tensor, seed: int, fractions=_FRACTIONS) -> dict[str, Tensor]:
    """Every class cut to the smallest class's size at random, then split by ``fractions`` per class."""
    g = torch.Generator().manual_seed(seed)
    size = int(torch.bincount(labels).min())
    cuts = np.cumsum([0] + [round(f * size) for f in fractions[:-1]] + [size])
    cuts[-1] = size
    parts = {s: [] for s in SPLITS}
    for c in torch.unique(labels).tolist():
        members = torch.nonzero(labels == c).flatten()
        members = members[torch.randperm(members.numel(), generator=g)][:size]
        for s, a, b in zip(SPLITS, cuts[:-1], cuts[1:], strict=True):
            parts[s].append(members[a:b])
    return {s: torch.cat(p)[torch.randperm(sum(x.numel() for x in p), generator=g)] for s, p in parts.items()}


def text_proxy(*, max_length: int = 1000, seed: int = 0) -> dict[str, SequenceDataset]:
    """Palestrina mass-section classification, bytes (see the module docstring).

    Args:
        max_length: L bytes per movement (LRA's code: 1,000; its paper: 4,000); movements average
            about 5,000 bytes, so both truncate most of them.
        seed: chooses the balanced subset and the split.

    Returns:
        ``train``, ``val``, ``test`` → :class:`SequenceDataset` (vocab_size 258, num_classes 6),
        157 movements per class (the smallest section, Kyrie) split 126 / 16 / 15 per class.
    """
    movements = palestrina_movements()
    labels = torch.tensor([m[1] for m in movements])
    out = {}
    for split, index in _balanced_splits(labels, seed).items():
        tokens, lengths = byte_tokens([movements[i][0] for i in index.tolist()], max_length,
                                      what=f"text proxy {split}")
        out[split] = SequenceDataset(tokens, lengths, labels[index], BYTE_VOCAB, len(MASS_SECTIONS))
    return out


def _mass_pairs(by_mass: dict[str, list[int]], masses: list[str], per_mass: int,
                rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """Same-mass pairs (at most ``per_mass`` per mass) and as many different-mass pairs, shuffled."""
    positives = []
    for mass in masses:
        pairs = list(itertools.combinations(by_mass[mass], 2))
        chosen = rng.permutation(len(pairs))[:per_mass]
        positives += [pairs[i] for i in chosen]
    owner = {doc: mass for mass in masses for doc in by_mass[mass]}
    docs = sorted(owner)
    negatives = set()
    while len(negatives) < len(positives):
        a, b = rng.choice(docs, size=2, replace=False).tolist()
        if owner[a] != owner[b]:
            negatives.add((a, b))
    pairs = [(a, b, 1) for a, b in positives] + [(a, b, 0) for a, b in sorted(negatives)]
    # Random order inside each pair too, so the first document is not always the earlier file.
    pairs = [(b, a, y) if rng.random() < 0.5 else (a, b, y) for a, b, y in pairs]
    return [pairs[i] for i in rng.permutation(len(pairs))]


def retrieval_proxy(*, max_length: int = 4000, seed: int = 0, per_mass: int = 40) -> dict[str, PairDataset]:
    """Same-mass detection on pairs of Palestrina movements, bytes (see the module docstring).

    Args:
        max_length: L bytes per document (LRA: 4,000).
        seed: chooses which masses go to which split, and the pairs.
        per_mass: at most this many same-mass pairs per mass (the largest masses would dominate).

    Returns:
        ``train``, ``val``, ``test`` → :class:`PairDataset` (vocab_size 258, num_classes 2),
        half the pairs of each split positive; no mass in two splits.
    """
    movements = palestrina_movements()
    by_mass: dict[str, list[int]] = defaultdict(list)
    for i, (_, _, mass) in enumerate(movements):
        by_mass[mass].append(i)
    masses = sorted(m for m, docs in by_mass.items() if len(docs) >= 2)
    rng = np.random.default_rng(seed)
    masses = [masses[i] for i in rng.permutation(len(masses))]
    cuts = np.cumsum([0] + [round(f * len(masses)) for f in _FRACTIONS[:-1]] + [len(masses)])
    cuts[-1] = len(masses)
    out = {}
    for split, a, b in zip(SPLITS, cuts[:-1], cuts[1:], strict=True):
        pairs = _mass_pairs(by_mass, masses[a:b], per_mass, rng)
        what = f"retrieval proxy {split}"
        t1, n1 = byte_tokens([movements[i][0] for i, _, _ in pairs], max_length, what=what)
        t2, n2 = byte_tokens([movements[j][0] for _, j, _ in pairs], max_length, what=what)
        out[split] = PairDataset(t1, n1, t2, n2, torch.tensor([y for _, _, y in pairs]), BYTE_VOCAB, 2)
    return out


def image_proxy(*, seed: int = 0) -> dict[str, SequenceDataset]:
    """Handwritten digits as 32 × 32 grey-level sequences (see the module docstring).

    Args:
        seed: chooses the balanced subset and the split.

    Returns:
        ``train``, ``val``, ``test`` → :class:`SequenceDataset` with tokens (N, 1024) = level + 2
        (vocab_size 258), num_classes 10, grid (32, 32); 174 images per class (the smallest),
        split 139 / 17 / 18 per class.

    Raises:
        ImportError: if scikit-learn (the ``lra`` extra) is not installed.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise ImportError("the LRA Image proxy uses scikit-learn's digits: pip install 'spe[lra]'") from err
    digits = load_digits()
    # 8 × 8 levels 0–16 → each pixel a 4 × 4 block, levels × 255/16 rounded: 32 × 32, 0–255.
    big = np.kron(digits.images, np.ones((1, 4, 4)))
    levels = np.rint(big * (255 / 16)).astype(np.uint8).reshape(len(big), 1024)
    labels = torch.from_numpy(digits.target.astype(np.int64))
    return {split: image_dataset(levels[index.numpy()], labels[index], (32, 32), 10)
            for split, index in _balanced_splits(labels, seed).items()}

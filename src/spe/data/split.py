"""The one training / validation split of a corpus, shared by training, evaluation and the report.

Letters: N = validation sequences, T = tokens per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import Tensor

from spe.data.dataset import prefix_batch

__all__ = ["CorpusSplit", "load_split", "split_of_run", "validation_sequences"]


@dataclass
class CorpusSplit:
    """A tokenised corpus split by piece.

    Attributes:
        train_pieces: token id arrays of the training pieces.
        val_pieces: token id arrays of the validation pieces.
        tokenizer_json: parameters of the tokenizer that produced the ids (JSON text).
    """

    train_pieces: list[np.ndarray]
    val_pieces: list[np.ndarray]
    tokenizer_json: str


def load_split(data: str | None, *, cache_dir: str | None, val_fraction: float = 0.05, split_seed: int = 0,
               progress: bool = False) -> CorpusSplit:
    """Loads (tokenises or reads from cache) a corpus and splits it by piece.

    Args:
        data: MIDI folder, ``music21:NAME`` or None for the Bach chorales (see
            :func:`spe.data.music.load_corpus`).
        cache_dir: converted MIDI and token caches.
        val_fraction: share of pieces held out, in (0, 1).
        split_seed: seed of the split.
        progress: show a progress bar while tokenising.

    Raises:
        ValueError: (``DataError``) on unusable data or a corpus too small to split.
    """
    from spe.data.music import load_corpus

    corpus = load_corpus(data, cache_dir=cache_dir, progress=progress)
    train_idx, val_idx = corpus.split(val_fraction, split_seed)
    return CorpusSplit([corpus.pieces[i] for i in train_idx], [corpus.pieces[i] for i in val_idx],
                       corpus.tokenizer_json)


def split_of_run(train_config: dict, *, data: str | None = None, cache_dir: str | None = None,
                 tokenizer_json: str | None = None) -> CorpusSplit:
    """The split a run was validated on: its data, fraction and seed, unless ``data``/``cache_dir`` are given.

    Args:
        train_config: the run's recorded training options (``LoadedCheckpoint.train_config``).
        data: other data to evaluate on (default: the run's).
        cache_dir: other cache folder (default: the run's).
        tokenizer_json: the run's tokenizer; when given, the corpus must have been tokenised
            the same way.

    Raises:
        ValueError: if the corpus's tokenizer differs from ``tokenizer_json``, or from :func:`load_split`.
    """
    from spe.data.music import same_tokenizer

    split = load_split(data if data is not None else train_config.get("data"),
                       cache_dir=cache_dir or train_config.get("cache_dir"),
                       val_fraction=train_config.get("val_fraction", 0.05),
                       split_seed=train_config.get("split_seed", 0))
    if tokenizer_json is not None and not same_tokenizer(tokenizer_json, split.tokenizer_json):
        raise ValueError("the checkpoint's REMI tokenizer differs from this installation's (another MidiTok "
                         "version?): token ids would not match")
    return split


def validation_sequences(split: CorpusSplit, length: int) -> Tensor:
    """The first ``length + 1`` tokens of every validation piece that long: (N, length + 1) int64.

    Raises:
        ValueError: if no validation piece is that long (names the longest).
    """
    seqs = prefix_batch(split.val_pieces, length + 1)
    if len(seqs) == 0:
        longest = max(len(p) for p in split.val_pieces)
        raise ValueError(f"no validation piece has {length + 1} tokens (longest: {longest}); lower --max-length")
    return seqs

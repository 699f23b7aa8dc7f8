"""The one training / validation split of a corpus, shared by training, evaluation and the report.

Letters: N = validation sequences, T = tokens per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import Tensor

from spe.data.dataset import prefix_batch

__all__ = ["SPLITS", "CorpusSplit", "load_split", "same_data", "split_of_run", "validation_sequences"]

# What ``spe evaluate --split`` evaluates: the held-out pieces, the training pieces, or every piece.
SPLITS = ("validation", "train", "all")


@dataclass
class CorpusSplit:
    """A tokenised corpus split by piece.

    Attributes:
        train_pieces: token id arrays of the training pieces.
        val_pieces: token id arrays of the validation pieces.
        tokenizer_json: parameters of the tokenizer that produced the ids (JSON text).
        evaluated: which pieces ``val_pieces`` holds for evaluation: ``validation`` (the
            held-out split), ``train`` (the training pieces) or ``all`` (every piece; then
            ``train_pieces`` holds every piece too, for the unigram baseline).
    """

    train_pieces: list[np.ndarray]
    val_pieces: list[np.ndarray]
    tokenizer_json: str
    evaluated: str = "validation"


def load_split(data: str | None, *, cache_dir: str | None, val_fraction: float = 0.05, split_seed: int = 0,
               progress: bool = False, max_piece_tokens: int | None = None) -> CorpusSplit:
    """Loads (tokenises or reads from cache) a corpus and splits it by piece.

    Args:
        data: MIDI folder, ``music21:NAME`` or None for the Bach chorales (see
            :func:`spe.data.music.load_corpus`).
        cache_dir: converted MIDI and token caches.
        val_fraction: share of pieces held out, in (0, 1).
        split_seed: seed of the split.
        progress: show a progress bar while tokenising.
        max_piece_tokens: the longest piece kept, in tokens (None:
            :data:`spe.data.music.MAX_PIECE_TOKENS`); longer ones are cropped and counted.

    Raises:
        ValueError: (``DataError``) on unusable data or a corpus too small to split.
    """
    from spe.data.music import DataError, load_corpus

    corpus = load_corpus(data, cache_dir=cache_dir, progress=progress, **_piece_bound(max_piece_tokens))
    try:
        train_idx, val_idx = corpus.split(val_fraction, split_seed)
    except DataError as err:
        raise DataError(f"{data or 'the Bach chorales'}: {err}") from None
    return CorpusSplit([corpus.pieces[i] for i in train_idx], [corpus.pieces[i] for i in val_idx],
                       corpus.tokenizer_json)


def _piece_bound(max_piece_tokens: int | None) -> dict:
    """``load_corpus``'s keyword for a bound (None: its default)."""
    return {} if max_piece_tokens is None else {"max_piece_tokens": max_piece_tokens}


def same_data(a: str | None, b: str | None) -> bool:
    """Whether two ``data`` options name the same corpus (folders compared by their resolved paths)."""
    if a is None or b is None:
        return a is None and b is None
    if str(a).startswith("music21:") or str(b).startswith("music21:"):
        return str(a) == str(b)
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def split_of_run(train_config: dict, *, data: str | None = None, cache_dir: str | None = None,
                 tokenizer_json: str | None = None, split: str | None = None,
                 max_piece_tokens: int | None = None) -> CorpusSplit:
    """The pieces to evaluate a run on.

    By default (``split`` None) the run's own validation split when ``data`` is the run's
    training data (or not given), and every piece of ``data`` otherwise: a folder of the
    user's is evaluated whole.

    Args:
        train_config: the run's recorded training options (``LoadedCheckpoint.train_config``).
        data: other data to evaluate on (default: the run's).
        cache_dir: other cache folder (default: the run's).
        tokenizer_json: the run's tokenizer; when given, the corpus must have been tokenised
            the same way.
        split: ``validation`` (held-out pieces, with the run's fraction and seed), ``train``,
            ``all``, or None for the default above.
        max_piece_tokens: the longest piece kept, in tokens (default: the run's, or
            :data:`spe.data.music.MAX_PIECE_TOKENS` for runs that recorded none).

    Raises:
        ValueError: on an unknown split, if the corpus's tokenizer differs from
            ``tokenizer_json``, or from :func:`load_split`.
    """
    from spe.data.music import load_corpus, same_tokenizer

    run_data = train_config.get("data")
    if split is None:
        split = "validation" if data is None or same_data(data, run_data) else "all"
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    source = data if data is not None else run_data
    cache = cache_dir or train_config.get("cache_dir")
    bound = max_piece_tokens if max_piece_tokens is not None else train_config.get("max_piece_tokens")
    if split == "all":
        corpus = load_corpus(source, cache_dir=cache, progress=False, **_piece_bound(bound))
        result = CorpusSplit(corpus.pieces, corpus.pieces, corpus.tokenizer_json, "all")
    else:
        result = load_split(source, cache_dir=cache, val_fraction=train_config.get("val_fraction", 0.05),
                            split_seed=train_config.get("split_seed", 0), max_piece_tokens=bound)
        if split == "train":
            result = CorpusSplit(result.train_pieces, result.train_pieces, result.tokenizer_json, "train")
    if tokenizer_json is not None and not same_tokenizer(tokenizer_json, result.tokenizer_json):
        raise ValueError("the checkpoint's REMI tokenizer differs from this installation's (another MidiTok "
                         "version?): token ids would not match")
    return result


def validation_sequences(split: CorpusSplit, length: int) -> Tensor:
    """The first ``length + 1`` tokens of every evaluated piece that long: (N, length + 1) int64.

    Raises:
        ValueError: if no validation piece is that long (names the longest).
    """
    seqs = prefix_batch(split.val_pieces, length + 1)
    if len(seqs) == 0:
        longest = max((len(p) for p in split.val_pieces), default=0)
        raise ValueError(f"no piece of the {split.evaluated} split has {length + 1} tokens "
                         f"(longest: {longest}); lower --max-length")
    return seqs

"""The one training / validation (/ test) split of a corpus, shared by training, evaluation and the report.

The test split (the gates study's 16× protocol, docs/gates.md) is held out before the training / validation split:
``num_test_pieces`` pieces of at least ``test_min_tokens`` tokens that neither training nor
validation ever sees, chosen by a hash of their tokens (:func:`hold_out_test_pieces`), so that
every run on a corpus, whatever its seeds, is tested on the same pieces.

Letters: N = validation sequences, T = tokens per sequence.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from torch import Tensor

from spe.lab.music.dataset import prefix_batch

__all__ = ["MIN_VALIDATION_PIECES", "NUM_TEST_PIECES", "SPLITS", "CorpusSplit", "hold_out_test_pieces", "load_split",
           "same_data", "split_of_run", "validation_sequences"]

# Test pieces a run holds out by default when it asks for a test split (the gates study asks for at least 30 per corpus).
NUM_TEST_PIECES = 30

# Fewer validation pieces than this are warned about: a validation loss (and an evaluation of the
# split) that rests on one or two pieces says little (a 26-piece folder at val_fraction 0.05 gave one).
MIN_VALIDATION_PIECES = 3

# What ``spe evaluate --split`` evaluates: the held-out pieces, the training pieces, every piece,
# or the test pieces of a run trained with ``test_min_tokens``.
SPLITS = ("validation", "train", "all", "test")


@dataclass
class CorpusSplit:
    """A tokenised corpus split by piece.

    Attributes:
        train_pieces: token id arrays of the training pieces.
        val_pieces: token id arrays of the validation pieces.
        tokenizer_json: parameters of the tokenizer that produced the ids (JSON text).
        evaluated: which pieces ``val_pieces`` holds for evaluation: ``validation`` (the
            held-out split), ``train`` (the training pieces), ``all`` (every piece; then
            ``train_pieces`` holds every piece too, for the unigram baseline) or ``test``.
        test_pieces: token id arrays of the test pieces, each at least ``test_min_tokens``
            long (empty without a test split).
        test_min_tokens: the shortest test piece allowed, in tokens (0: no test split).
    """

    train_pieces: list[np.ndarray]
    val_pieces: list[np.ndarray]
    tokenizer_json: str
    evaluated: str = "validation"
    test_pieces: list[np.ndarray] = field(default_factory=list)
    test_min_tokens: int = 0


def load_split(data: str | None, *, cache_dir: str | None, val_fraction: float = 0.05, split_seed: int = 0,
               progress: bool = False, max_piece_tokens: int | None = None, test_min_tokens: int = 0,
               num_test_pieces: int = NUM_TEST_PIECES, tokenizer=None) -> CorpusSplit:
    """Loads (tokenises or reads from cache) a corpus and splits it by piece.

    With ``test_min_tokens`` > 0 the test pieces (:func:`hold_out_test_pieces`) are taken out
    first, and the rest is split as a corpus without them; with 0 the split is the one every
    run made before test splits existed, piece for piece.

    Args:
        data: MIDI folder, ``music21:NAME`` or None for the Bach chorales (see
            :func:`spe.lab.music.corpus.load_corpus`).
        cache_dir: converted MIDI and token caches.
        val_fraction: share of pieces held out, in (0, 1).
        split_seed: seed of the split.
        progress: show a progress bar while tokenising.
        max_piece_tokens: the longest piece kept, in tokens (None:
            :data:`spe.lab.music.corpus.MAX_PIECE_TOKENS`); longer ones are cropped and counted.
        test_min_tokens: the shortest test piece, in tokens (16 L + 1 for next-token targets
            at 16 L positions); 0: no test split.
        num_test_pieces: how many test pieces (ignored when ``test_min_tokens`` is 0).
        tokenizer: what the tokenizer keeps, or a run's stored tokenizer (see
            :func:`spe.lab.music.corpus.load_corpus`; None: the defaults).

    Raises:
        ValueError: (``DataError``) on unusable data, a corpus too small to split, or fewer
            than ``num_test_pieces`` pieces of ``test_min_tokens`` tokens.
    """
    from spe.lab.music.corpus import Corpus, DataError, load_corpus

    corpus = load_corpus(data, cache_dir=cache_dir, progress=progress, tokenizer=tokenizer,
                         **_piece_bound(max_piece_tokens))
    where = data or "the Bach chorales"
    test, rest = [], corpus
    if test_min_tokens > 0:
        test, kept = hold_out_test_pieces(corpus.pieces, test_min_tokens, num_test_pieces, where=where)
        rest = Corpus([corpus.names[i] for i in kept], [corpus.pieces[i] for i in kept],
                      corpus.tokenizer_json)
    try:
        train_idx, val_idx = rest.split(val_fraction, split_seed)
    except DataError as err:
        held = f" (after holding out {len(test)} test pieces)" if test else ""
        raise DataError(f"{where}: {err}{held}") from None
    _warn_small_validation(where, len(val_idx), len(rest.pieces), val_fraction)
    return CorpusSplit([rest.pieces[i] for i in train_idx], [rest.pieces[i] for i in val_idx],
                       corpus.tokenizer_json, test_pieces=[corpus.pieces[i] for i in test],
                       test_min_tokens=test_min_tokens)


def _warn_small_validation(where: str, n_val: int, n_pieces: int, val_fraction: float) -> None:
    """Warns when the validation split has fewer than :data:`MIN_VALIDATION_PIECES` pieces,
    naming the ``val_fraction`` that would give that many (round(f · n) pieces, one at least)."""
    if n_val >= MIN_VALIDATION_PIECES:
        return
    # the smallest fraction in hundredths that holds out enough, as Corpus.split counts them
    enough = [f / 100 for f in range(1, 100)
              if min(max(1, round(f / 100 * n_pieces)), n_pieces - 1) >= MIN_VALIDATION_PIECES]
    if enough:
        fix = f"--val-fraction {enough[0]:g} (val_fraction) holds out {MIN_VALIDATION_PIECES}"
    else:
        fix = f"add pieces: {n_pieces} cannot give {MIN_VALIDATION_PIECES} and still train"
    warnings.warn(f"{where}: {n_val} validation piece(s) of {n_pieces} (val_fraction {val_fraction:g}): validation "
                  f"and evaluation rest on {'it' if n_val == 1 else 'them'}; {fix}", stacklevel=3)


def _content_digest(piece: np.ndarray) -> bytes:
    """A hash of a piece's token ids (little-endian int64: the same on every platform)."""
    return hashlib.blake2b(np.ascontiguousarray(piece, dtype="<i8").tobytes(), digest_size=16).digest()


def hold_out_test_pieces(pieces: list[np.ndarray], min_tokens: int, count: int, *,
                         where: str = "the corpus") -> tuple[list[int], list[int]]:
    """Which pieces are the test split, and which remain for training and validation.

    The test pieces are the ``count`` pieces of at least ``min_tokens`` tokens whose token
    hashes come first: a pseudo-random choice that depends on the pieces alone (not on their
    order, names or any seed), so every run on a corpus is tested on the same pieces, and
    adding or removing other pieces changes at most one place in the choice. Pieces whose
    tokens equal a test piece's (the same score twice in a corpus) are held out with it:
    training never sees a test piece, not even as a copy.

    Args:
        pieces: token id arrays of the whole corpus.
        min_tokens: the shortest test piece, in tokens (≥ 1).
        count: test pieces wanted (≥ 1).
        where: the corpus, for messages.

    Returns:
        (test indices, indices of the other pieces), each in increasing order.

    Raises:
        ValueError: (``DataError``) naming the corpus, the count of pieces that long and the
            longest piece, if fewer than ``count`` distinct pieces have ``min_tokens`` tokens.
    """
    from spe.lab.music.corpus import DataError

    digests = [_content_digest(p) for p in pieces]
    long_enough = [i for i, p in enumerate(pieces) if len(p) >= min_tokens]
    first = {}  # digest -> the first long-enough piece holding it, in the order of digests
    for i in sorted(long_enough, key=lambda i: (digests[i], i)):
        first.setdefault(digests[i], i)
    if len(first) < count:
        longest = max((len(p) for p in pieces), default=0)
        raise DataError(f"{where}: {len(first)} distinct pieces have at least {min_tokens} tokens (the "
                        f"longest has {longest}), fewer than num_test_pieces = {count}: lower "
                        "test_min_tokens or num_test_pieces")
    chosen = set(list(first)[:count])
    test = sorted(first[d] for d in chosen)
    return test, [i for i, d in enumerate(digests) if d not in chosen]


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
        tokenizer_json: the run's tokenizer: the corpus is tokenised with it (so a run keeps
            its own tokenisation whatever the defaults now are). Without it, the tokenizer
            options the run recorded (``tempos``, ``time_signatures``; for a run that recorded
            none, the tokenizer of its time, :func:`~spe.lab.music.corpus.recorded_tokenizer`).
        split: ``validation`` (held-out pieces, with the run's fraction and seed), ``train``,
            ``all``, ``test`` (the pieces the run held out with its ``test_min_tokens`` and
            ``num_test_pieces``), or None for the default above.
        max_piece_tokens: the longest piece kept, in tokens (default: the run's, or
            :data:`spe.lab.music.corpus.MAX_PIECE_TOKENS` for runs that recorded none).

    Raises:
        ValueError: on an unknown split, ``test`` for a run trained without a test split, if
            the corpus's tokenizer differs from ``tokenizer_json``, or from :func:`load_split`.
    """
    from spe.lab.music.corpus import load_corpus, recorded_tokenizer, same_tokenizer

    run_data = train_config.get("data")
    tokenizer = tokenizer_json if tokenizer_json is not None else recorded_tokenizer(train_config)
    if split is None:
        split = "validation" if data is None or same_data(data, run_data) else "all"
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    # Runs from before test splits recorded neither option: they held nothing out.
    test_min_tokens = train_config.get("test_min_tokens", 0)
    if split == "test" and not test_min_tokens:
        raise ValueError("the run holds no test split (it was trained with test_min_tokens = 0, or by an "
                         "spe without it): train a run whose config file (spe train --config) sets "
                         "test_min_tokens (e.g. 16 × seq_len + 1) to hold num_test_pieces pieces that long "
                         "out of its training")
    source = data if data is not None else run_data
    cache = cache_dir or train_config.get("cache_dir")
    bound = max_piece_tokens if max_piece_tokens is not None else train_config.get("max_piece_tokens")
    if split == "all":
        corpus = load_corpus(source, cache_dir=cache, progress=False, tokenizer=tokenizer, **_piece_bound(bound))
        result = CorpusSplit(corpus.pieces, corpus.pieces, corpus.tokenizer_json, "all")
    else:
        result = load_split(source, cache_dir=cache, val_fraction=train_config.get("val_fraction", 0.05),
                            split_seed=train_config.get("split_seed", 0), max_piece_tokens=bound,
                            test_min_tokens=test_min_tokens,
                            num_test_pieces=train_config.get("num_test_pieces", NUM_TEST_PIECES),
                            tokenizer=tokenizer)
        if split == "train":
            result = CorpusSplit(result.train_pieces, result.train_pieces, result.tokenizer_json, "train")
        elif split == "test":
            result = CorpusSplit(result.train_pieces, result.test_pieces, result.tokenizer_json, "test",
                                 result.test_pieces, test_min_tokens)
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

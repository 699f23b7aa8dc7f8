"""Symbolic music corpora as REMI token streams (MidiTok), with an on-disk cache.

* :func:`bach_chorales_midi` converts the J.S. Bach chorales shipped in ``music21``'s corpus
  to MIDI once (cached); :func:`music21_corpus_midi` does the same for any composer or
  collection of that corpus (``--data music21:palestrina``).
* :func:`load_corpus` tokenises a folder of MIDI files (recursive, ``.mid``/``.midi`` in any
  case) to REMI with one token stream for all voices; unreadable files are skipped with a
  warning naming each; the result is cached, keyed by the files and the tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from spe.checkpoint import atomic_write

__all__ = [
    "MUSIC21_PREFIX",
    "Corpus",
    "DataError",
    "bach_chorales_midi",
    "default_cache_dir",
    "find_midi_files",
    "load_corpus",
    "make_tokenizer",
    "music21_corpus_midi",
    "same_tokenizer",
    "tokenizer_from_json",
    "tokenizer_to_json",
]

log = logging.getLogger(__name__)

# Analyses (.rntxt), Humdrum duplicates of MusicXML chorales (.krn) and the one prelude are
# not chorales.
_NOT_CHORALES = ("bwv846",)
# ``data`` of the form "music21:NAME" selects a composer or collection of music21's corpus.
MUSIC21_PREFIX = "music21:"


class DataError(ValueError):
    """A data folder or file that cannot be used, with the reason."""


@dataclass
class Corpus:
    """Tokenised pieces.

    Attributes:
        names: piece names (file paths relative to the data folder).
        pieces: one int64 array of token ids per piece.
        tokenizer_json: the MidiTok tokenizer's parameters (JSON text).
    """

    names: list[str]
    pieces: list[np.ndarray]
    tokenizer_json: str

    def split(self, val_fraction: float = 0.05, seed: int = 0) -> tuple[list[int], list[int]]:
        """Splits piece indices into (train, validation) by piece, with a fixed seed.

        Raises:
            DataError: if the fraction is outside (0, 1) or the corpus is too small to split.
        """
        if not 0.0 < val_fraction < 1.0:
            raise DataError(f"val_fraction must be in (0, 1), got {val_fraction}")
        if len(self.pieces) < 2:
            raise DataError(f"need at least 2 pieces to split into training and validation, got {len(self.pieces)}")
        order = torch.randperm(len(self.pieces), generator=torch.Generator().manual_seed(seed)).tolist()
        n_val = min(max(1, round(val_fraction * len(order))), len(order) - 1)
        return sorted(order[n_val:]), sorted(order[:n_val])


def default_cache_dir() -> Path:
    """``$SPE_CACHE_DIR``, or ``~/.cache/spe``."""
    return Path(os.environ.get("SPE_CACHE_DIR", Path.home() / ".cache" / "spe"))


def make_tokenizer():
    """REMI with programs, one token stream for all voices (MidiTok defaults otherwise)."""
    from miditok import REMI, TokenizerConfig

    return REMI(TokenizerConfig(use_programs=True, one_token_stream_for_programs=True))


def tokenizer_to_json(tokenizer) -> str:
    """The tokenizer's parameters as JSON text (stored in checkpoints and cache keys).

    Keys keep MidiTok's order: it numbers the ``TimeSig`` tokens in the order of
    ``time_signature_range``, so sorting the keys (as versions before this fix did) renumbers
    them when the tokenizer is rebuilt.
    """
    return json.dumps(tokenizer.to_dict(), default=str)


def same_tokenizer(a: str, b: str) -> bool:
    """Whether two stored tokenizers have the same parameters, whatever their key order."""
    return json.loads(a) == json.loads(b)


def tokenizer_from_json(text: str):
    """Rebuilds a tokenizer from :func:`tokenizer_to_json` output (stored in checkpoints).

    The library's own tokenizer is rebuilt with :func:`make_tokenizer`, so its token ids are
    exactly those of the corpus, also for checkpoints written with sorted keys.
    """
    import tempfile

    from miditok import REMI

    fresh = make_tokenizer()
    if same_tokenizer(text, tokenizer_to_json(fresh)):
        return fresh
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        path.write_text(text)
        return REMI(params=path)


def _convert_score(args: tuple[str, str]) -> str | None:
    source, target = args
    from music21 import corpus

    try:
        score = corpus.parse(source)
        atomic_write(target, lambda tmp: score.write("midi", fp=tmp))
        return None
    except Exception as err:  # noqa: BLE001 - one bad score must not stop the corpus
        return f"{source}: {err}"


def bach_chorales_midi(cache_dir: str | os.PathLike | None = None, *, workers: int = 2) -> Path:
    """Writes the Bach chorales of music21's corpus as MIDI files, once.

    Returns:
        The folder of ``.mid`` files (``cache_dir/bach-chorales-midi-m21-VERSION``).
    """
    return music21_corpus_midi("bach", cache_dir, workers=workers)


# Score formats of music21's corpus that convert to MIDI (.rntxt files are harmonic analyses).
_SCORE_SUFFIXES = (".mxl", ".xml", ".musicxml", ".krn", ".abc", ".mid", ".midi")


def music21_corpus_midi(composer: str, cache_dir: str | os.PathLike | None = None, *, workers: int = 2,
                        stride: int = 1) -> Path:
    """Writes the scores of one composer (or collection) of music21's corpus as MIDI, once.

    ``bach`` keeps the chorales only (the Well-Tempered Clavier prelude is left out), as the
    default corpus of the main job. Other names are those of ``music21.corpus.getComposer``,
    e.g. ``palestrina`` (1,318 Humdrum files, about 1 s each to convert on one core) or
    ``monteverdi``. Scores that fail to convert are skipped with a warning naming each; the
    next call retries them.

    Args:
        composer: music21 composer or collection name.
        cache_dir: where the MIDI folder is written (default :func:`default_cache_dir`).
        workers: conversion processes.
        stride: keep every ``stride``-th score of the sorted list (a deterministic subset of
            a large collection, e.g. 330 of Palestrina's 1,318 with stride 4).

    Returns:
        The folder of ``.mid`` files (``cache_dir/NAME-midi-m21-VERSION``).

    Raises:
        DataError: if music21 has no score under that name.
    """
    import music21
    from music21 import corpus

    if stride < 1:
        raise DataError(f"stride must be a positive integer, got {stride}")
    name = ("bach-chorales" if composer == "bach" else composer) + (f"-every{stride}" if stride > 1 else "")
    out = Path(cache_dir or default_cache_dir()) / f"{name}-midi-m21-{music21.__version__}"
    done = out / ".complete"
    if done.exists():
        return out
    sources = [p for p in corpus.getComposer(composer) if p.suffix in _SCORE_SUFFIXES]
    if composer == "bach":
        sources = [p for p in sources if p.suffix in (".mxl", ".xml") and not p.stem.startswith(_NOT_CHORALES)]
    sources = sorted(sources)[::stride]
    if not sources:
        raise DataError(f"music21's corpus has no scores for {composer!r} (try bach, palestrina, monteverdi, "
                        "trecento, ryansMammoth)")
    out.mkdir(parents=True, exist_ok=True)
    stems = [p.stem for p in sources]
    if len(set(stems)) < len(stems):  # stems repeat across sub-folders: use the path inside the corpus
        common = Path(os.path.commonpath([str(p.parent) for p in sources]))
        stems = [str(p.relative_to(common).with_suffix("")).replace(os.sep, "__") for p in sources]
    targets = [out / f"{stem}.mid" for stem in stems]
    jobs = [(str(p), str(t)) for p, t in zip(sources, targets) if not t.exists()]
    if jobs:
        from tqdm import tqdm

        log.info("converting %d %s scores from music21 to MIDI (once)", len(jobs), composer)
        if workers > 1:
            import multiprocessing as mp

            with mp.get_context("spawn").Pool(workers) as pool:
                results = list(tqdm(pool.imap_unordered(_convert_score, jobs), total=len(jobs),
                                    desc="music21 -> MIDI", unit="piece"))
        else:
            results = [_convert_score(j) for j in tqdm(jobs, desc="music21 -> MIDI", unit="piece")]
        failures = [f for f in results if f]
        for failure in failures:
            warnings.warn(f"skipped score {failure}", stacklevel=2)
        if failures:  # no completion marker: the next run retries the missing ones
            return out
    done.write_text(f"{len(sources)}\n")
    return out


def _parse_music21(data: str) -> tuple[str, int]:
    """"music21:NAME" or "music21:NAME/S" -> (NAME, stride S)."""
    spec = data[len(MUSIC21_PREFIX):]
    name, _, stride = spec.partition("/")
    try:
        step = int(stride) if stride else 1
    except ValueError:
        raise DataError(f"{data!r}: the part after '/' must be a stride (an integer), "
                        "e.g. music21:palestrina/4") from None
    if not name or step < 1:
        raise DataError(f"{data!r} must read music21:NAME or music21:NAME/STRIDE with a positive stride")
    return name, step


def find_midi_files(folder: str | os.PathLike) -> list[Path]:
    """All ``.mid``/``.midi`` files below ``folder`` (any case), sorted.

    Raises:
        DataError: if the folder does not exist or holds no MIDI file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"data folder {folder} does not exist or is not a folder")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in (".mid", ".midi"))
    if not files:
        raise DataError(f"data folder {folder} holds no .mid or .midi file")
    return files


def _cache_key(files: list[Path], root: Path, tokenizer_json: str) -> str:
    h = hashlib.sha256(tokenizer_json.encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def load_corpus(data: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None = None,
                progress: bool = True) -> Corpus:
    """Tokenises a MIDI folder (or the Bach default when ``data`` is None) to REMI.

    Unreadable or corrupt files, and files with no notes, are skipped with a warning that
    names each, and a final count.

    Args:
        data: folder of MIDI files, ``music21:NAME`` for a composer or collection of
            music21's corpus (e.g. ``music21:palestrina``), or None for the Bach chorales.
        cache_dir: where converted MIDI and token caches live (default :func:`default_cache_dir`).
        progress: show a progress bar.

    Returns:
        A :class:`Corpus`.

    Raises:
        DataError: missing or empty folder, or no readable MIDI file in it.
    """
    from symusic import Score
    from tqdm import tqdm

    cache = Path(cache_dir or default_cache_dir())
    if data is None:
        root = bach_chorales_midi(cache)
    elif str(data).startswith(MUSIC21_PREFIX):
        name, stride = _parse_music21(str(data))
        root = music21_corpus_midi(name, cache, stride=stride)
    else:
        root = Path(data)
    files = find_midi_files(root)
    tokenizer = make_tokenizer()
    tok_json = tokenizer_to_json(tokenizer)
    cache_file = cache / "tokens" / f"{_cache_key(files, root, tok_json)}.npz"
    if cache_file.exists():
        stored = np.load(cache_file, allow_pickle=False)
        names = json.loads(str(stored["names"]))
        lengths = stored["lengths"]
        flat = stored["ids"]
        pieces = np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []
        log.info("loaded %d tokenised pieces from %s", len(names), cache_file)
        return Corpus(names=names, pieces=[p.astype(np.int64) for p in pieces], tokenizer_json=tok_json)

    names, pieces, skipped = [], [], []
    for f in tqdm(files, desc="REMI tokens", unit="file", disable=not progress):
        rel = str(f.relative_to(root))
        try:
            score = Score(str(f))
            ids = np.asarray(tokenizer.encode(score).ids, dtype=np.int64)
        except Exception as err:  # noqa: BLE001 - corrupt files are skipped, named, counted
            warnings.warn(f"skipped unreadable MIDI file {f}: {' '.join(str(err).split())}", stacklevel=2)
            skipped.append(rel)
            continue
        if ids.size < 2 or not any(len(t.notes) for t in score.tracks):  # zero-length piece
            warnings.warn(f"skipped MIDI file {f}: it has no notes", stacklevel=2)
            skipped.append(rel)
            continue
        names.append(rel)
        pieces.append(ids)
    if skipped:
        warnings.warn(f"skipped {len(skipped)} of {len(files)} MIDI files in {root}", stacklevel=2)
    if not pieces:
        raise DataError(f"no readable MIDI file with notes in {root} ({len(files)} tried)")
    lengths = np.array([len(p) for p in pieces], dtype=np.int64)
    flat = np.concatenate(pieces).astype(np.int32)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, names=np.array(json.dumps(names)), lengths=lengths, ids=flat)

    atomic_write(cache_file, write)
    return Corpus(names=names, pieces=pieces, tokenizer_json=tok_json)

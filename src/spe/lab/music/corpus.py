"""Symbolic music corpora as REMI token streams (MidiTok), with an on-disk cache.

* :func:`bach_chorales_midi` converts the J.S. Bach chorales shipped in ``music21``'s corpus
  to MIDI once (cached); :func:`music21_corpus_midi` does the same for any composer or
  collection of that corpus (``--data music21:palestrina``).
* :func:`load_corpus` tokenises a folder of MIDI files (recursive, ``.mid``/``.midi`` in any
  case) to REMI with one token stream for all voices; unreadable files are skipped with a
  warning naming each; pieces longer than ``max_piece_tokens`` are cropped and counted; the
  result is cached, keyed by the files, the tokenizer's parameters and ``max_piece_tokens``.
* :class:`TokenizerOptions` says what the tokenizer keeps of a score (tempo, time signatures:
  both by default); runs from before these options keep the tokenizer they used
  (:func:`legacy_tokenizer_json`); a run's stored tokenizer always wins over the options
  (:func:`tokenizer_from_json`).

Hostile folders: links to folders are followed, and a folder or file reached a
second time (a cycle, or a second link to it) is read once, with a warning that counts and
names them; file names that are not valid UTF-8 are read like any other, and shown with their
undecodable bytes escaped (``bad\\xff.mid``, :func:`display_name`) in piece names and messages.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from spe.checkpoint import atomic_write
from spe.lab.outputs import default_cache_dir, display_name, shown_names

__all__ = [
    "MAX_PIECE_TOKENS",
    "MAX_VOICES",
    "MUSIC21_PREFIX",
    "NUM_TEMPOS",
    "TEMPO_RANGE",
    "TIME_SIGNATURE_RANGE",
    "Corpus",
    "DataError",
    "TokenizerOptions",
    "bach_chorales_midi",
    "check_max_piece_tokens",
    "default_cache_dir",
    "display_name",
    "find_midi_files",
    "load_corpus",
    "make_tokenizer",
    "music21_corpus_midi",
    "legacy_tokenizer_json",
    "recorded_tokenizer",
    "same_tokenizer",
    "tokenizer_from_json",
    "tokenizer_options",
    "tokenizer_summary",
    "tokenizer_to_json",
]

log = logging.getLogger(__name__)

# Analyses (.rntxt), Humdrum duplicates of MusicXML chorales (.krn) and the one prelude are
# not chorales.
_NOT_CHORALES = ("bwv846",)
# ``data`` of the form "music21:NAME" selects a composer or collection of music21's corpus.
MUSIC21_PREFIX = "music21:"
# The longest piece kept, in REMI tokens; longer ones are cropped to their first
# MAX_PIECE_TOKENS tokens. 2^16: 3.8 times the longest Bach chorale of music21 (17,125 tokens,
# bwv248.64-6; the next is 7,909; median 1,198 over 409), so the default corpus is read whole,
# while a file whose events lie absurdly far apart (one note 10^7 ticks after another at one
# tick per beat: 5 M tokens, 2 GB) costs at most 2^16 tokens (512 KiB as int64).
MAX_PIECE_TOKENS = 65_536
# Quarter notes one REMI token covers at most: every bar costs at least a Bar token, and no bar
# MidiTok writes is longer than 6 quarters (its longest time signatures, 6/4 and 12/8); 8
# leaves a margin. The first max_tokens tokens of a score therefore lie before max_tokens × 8
# quarters: clipping the score there first keeps them when that many tokens come before (MidiTok
# writes bars only up to the last event, so a score whose events are farther apart keeps the
# tokens up to its last event before the clip, fewer), and tokenising costs O(max_tokens + notes).
_QUARTERS_PER_TOKEN = 8


# Tempo tokens: 40-250 quarter notes per minute in steps of 2 qpm (MidiTok places them evenly and
# rounds a score's tempo to the nearest): 60, 72, 90, 96, 120 … are exact, others within 1 qpm.
TEMPO_RANGE = (40, 250)
NUM_TEMPOS = 106
# The time signatures kept, numerators per denominator: those of the music21 corpora (Bach: 4/4,
# 3/4, 3/2, 12/8; Palestrina and the Renaissance collections: 4/2, 2/2, 3/2, 2/1, 3/1) and the
# common ones besides. A signature outside it is dropped by MidiTok (the previous one goes on).
TIME_SIGNATURE_RANGE = {1: [1, 2, 3, 4], 2: [1, 2, 3, 4, 5, 6, 8], 4: [1, 2, 3, 4, 5, 6, 7, 8, 9, 12],
                        8: [3, 5, 6, 7, 9, 12]}


# Tracks of one program kept apart (Track_1 … Track_15 after the first); a further track of that
# program joins the last one.
MAX_VOICES = 16
# The key of TokenizerConfig.additional_params (stored with the tokenizer) that marks a TrackREMI.
_VOICES_KEY = "spe_voices"


class DataError(ValueError):
    """A data folder or file that cannot be used, with the reason."""


@dataclass(frozen=True)
class TokenizerOptions:
    """What the REMI tokenizer keeps of a score besides its notes (pitch, velocity, duration,
    program, onset).

    Attributes:
        tempos: ``Tempo`` tokens (MidiTok's ``use_tempos``, :data:`TEMPO_RANGE` in
            :data:`NUM_TEMPOS` steps); without them every piece decodes at 120 qpm.
        time_signatures: ``TimeSig`` tokens after each bar (``use_time_signatures``,
            :data:`TIME_SIGNATURE_RANGE`); without them every bar is 4/4.
        merge_tracks: merge tracks that share a program into one, as MidiTok's REMI does (its
            one token stream names a note's track by its ``Program`` token only: five voices
            of one program become one track, two violins one). False (default): the k-th
            track of a program (k ≥ 1, in the file's track order, up to :data:`MAX_VOICES`)
            writes ``Track_k`` after each note's ``Program`` token (:class:`TrackREMI`), so
            the tracks decode apart; a file with one track per program gets no such token.
        legacy_tokenizer: the tokenizer every run used before the three options above existed
            (:func:`legacy_tokenizer_json`: MidiTok's REMI defaults, no tempo, MidiTok's own time
            signatures, tracks of one program merged; 486 tokens on the Bach chorales): the
            studies run then (ablation, peers, gates, learned-time) are rerun with it. The three
            options above are then not read.
    """

    tempos: bool = True
    time_signatures: bool = True
    merge_tracks: bool = False
    legacy_tokenizer: bool = False



@dataclass
class Corpus:
    """Tokenised pieces.

    Attributes:
        names: piece names (file paths relative to the data folder, undecodable bytes
            escaped as :func:`display_name` shows them).
        pieces: one int64 array of token ids per piece.
        tokenizer_json: the MidiTok tokenizer's parameters (JSON text).
        cropped: names of the pieces cut to ``max_piece_tokens`` tokens.
    """

    names: list[str]
    pieces: list[np.ndarray]
    tokenizer_json: str
    cropped: list[str] = field(default_factory=list)

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


def _track_remi_class():
    """:class:`TrackREMI`, built on first use (MidiTok is imported only where music is read)."""
    global TrackREMI
    if TrackREMI is not None:
        return TrackREMI
    from miditok import REMI, TokSequence
    from miditok.classes import Event

    class _TrackREMI(REMI):
        """MidiTok's REMI, one token stream, that keeps tracks sharing a program apart: after a
        note's ``Program_p`` token, ``Track_k`` names the k-th track of program p (k ≥ 1; none for
        the first), and decoding gives each (program, k) its own track. Notes keep REMI's order
        (by onset, then track), so every clock token and the grammar are REMI's."""

        def _tweak_config_before_creating_voc(self) -> None:
            super()._tweak_config_before_creating_voc()
            self._merge_same_program_tracks = False

        def _create_base_vocabulary(self) -> list[str]:
            return super()._create_base_vocabulary() + [f"Track_{k}" for k in range(1, self._voices)]

        @property
        def _voices(self) -> int:
            return int(self.config.additional_params[_VOICES_KEY])

        def _create_token_types_graph(self) -> dict[str, set[str]]:
            graph = super()._create_token_types_graph()
            graph["Track"] = set(graph["Program"])
            graph["Program"] = graph["Program"] | {"Track"}
            return graph

        def _score_to_tokens(self, score, attribute_controls_indexes=None):
            seen: dict[tuple[int, bool], int] = {}
            voices = []
            for track in score.tracks:  # the order REMI reads them in
                key = (track.program, track.is_drum)
                voices.append(min(seen.get(key, 0), self._voices - 1))
                seen[key] = seen.get(key, 0) + 1
            self._track_voices = iter(voices)
            return super()._score_to_tokens(score, attribute_controls_indexes)

        def _create_track_events(self, track, *args, **kwargs) -> list[Event]:
            events = super()._create_track_events(track, *args, **kwargs)
            voice = next(self._track_voices)
            if voice == 0:
                return events
            out = []
            for event in events:
                out.append(event)
                if event.type_ == "Program":
                    out.append(Event("Track", voice, event.time, event.program, event.desc))
            return out

        def _tokens_to_score(self, tokens, programs=None):
            streams = _voice_streams(tokens.tokens)
            score = super()._tokens_to_score(TokSequence(tokens=streams.pop(0, [])), programs)
            for voice in sorted(streams):
                part = super()._tokens_to_score(TokSequence(tokens=streams[voice]), programs)
                score.tracks.extend([t for t in part.tracks if len(t.notes)])
            return score

        def _tokens_errors(self, tokens) -> int:
            return super()._tokens_errors([t for t in tokens if not t.startswith("Track_")])

    _TrackREMI.__name__ = _TrackREMI.__qualname__ = "TrackREMI"  # pickled by reference to this module's name
    TrackREMI = _TrackREMI
    return TrackREMI


TrackREMI = None


def _voice_streams(tokens: list[str]) -> dict[int, list[str]]:
    """A TrackREMI token stream split into one REMI stream per voice k (voice 0: the notes
    without a ``Track`` token): every voice keeps every token but the notes of other voices
    (``Program``, ``Track`` and the tokens up to the next ``Program``, ``Position`` or ``Bar``)."""
    voice_of = []  # the voice each token belongs to, None for every voice
    current = None
    for i, token in enumerate(tokens):
        kind = token.split("_", 1)[0]
        if kind == "Program":
            nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
            current = int(nxt.split("_", 1)[1]) if nxt.startswith("Track_") else 0
        elif kind in ("Position", "Bar", "TimeSig", "Tempo"):
            current = None
        voice_of.append(current)
    voices = {0} | {v for v in voice_of if v is not None}
    return {v: [t for t, w in zip(tokens, voice_of) if (w is None or w == v) and not t.startswith("Track_")]
            for v in voices}


def make_tokenizer(options: TokenizerOptions | None = None):
    """REMI with programs, one token stream for all voices, tempo and time signatures as
    ``options`` say (default :class:`TokenizerOptions`: both kept); MidiTok's defaults otherwise
    (``legacy_tokenizer``: the tokenizer of the runs from before these options, whole)."""
    from miditok import REMI, TokenizerConfig

    options = options or TokenizerOptions()
    if options.legacy_tokenizer:
        return _legacy_tokenizer()
    kept = {"use_time_signatures": options.time_signatures}  # MidiTok's default keeps a few (no x/2)
    if options.tempos:
        kept.update(use_tempos=True, tempo_range=TEMPO_RANGE, num_tempos=NUM_TEMPOS)
    if options.time_signatures:
        kept.update(time_signature_range=TIME_SIGNATURE_RANGE)
    if options.merge_tracks:
        return REMI(TokenizerConfig(use_programs=True, one_token_stream_for_programs=True, **kept))
    kept[_VOICES_KEY] = MAX_VOICES
    return _track_remi_class()(TokenizerConfig(use_programs=True, one_token_stream_for_programs=True, **kept))


def _legacy_tokenizer():
    from miditok import REMI, TokenizerConfig

    return REMI(TokenizerConfig(use_programs=True, one_token_stream_for_programs=True))


def legacy_tokenizer_json() -> str:
    """The tokenizer of runs trained before :class:`TokenizerOptions` existed (recorded no option):
    MidiTok's defaults, no tempo, its own time signatures (4/4, 3/4, 6/8 …, none in halves),
    tracks of one program merged."""
    return tokenizer_to_json(_legacy_tokenizer())


def tokenizer_options(tokenizer_json: str) -> TokenizerOptions:
    """What a stored tokenizer (:func:`tokenizer_to_json`) keeps, as options (the range of its
    time signatures aside: a run's stored tokenizer is rebuilt as it is, :func:`tokenizer_from_json`)."""
    config = json.loads(tokenizer_json).get("config", {})
    return TokenizerOptions(tempos=bool(config.get("use_tempos", False)),
                            time_signatures=bool(config.get("use_time_signatures", False)),
                            merge_tracks=_VOICES_KEY not in config.get("additional_params", {}),
                            legacy_tokenizer=same_tokenizer(tokenizer_json, legacy_tokenizer_json()))


def recorded_tokenizer(train_config: dict) -> TokenizerOptions | str:
    """The tokenizer of a run's recorded training options: its ``tempos`` and
    ``time_signatures``, or, for a run from before them (it recorded neither), the tokenizer
    every run then used (:func:`legacy_tokenizer_json`, JSON text as :func:`load_corpus` takes it)."""
    names = [f.name for f in fields(TokenizerOptions)]
    if not any(name in train_config for name in names):
        return legacy_tokenizer_json()
    defaults = TokenizerOptions()
    return TokenizerOptions(**{name: bool(train_config.get(name, getattr(defaults, name))) for name in names})


def tokenizer_summary(tokenizer) -> str:
    """One line: what a REMI tokenizer keeps of a score and what it drops."""
    config = tokenizer.config
    kept, dropped = ["notes (pitch, velocity, duration, onset)", "programs"], []
    if config.use_tempos:
        low, high = config.tempo_range
        kept.append(f"tempo ({low:g}-{high:g} qpm, {config.num_tempos} values)")
    else:
        dropped.append("tempo (every piece decodes at 120 qpm)")
    if config.use_time_signatures:
        kept.append("time signatures " + ", ".join(f"{n}/{d}" for n, d in tokenizer.time_signatures)
                    + " (others: the previous one goes on)")
    else:
        dropped.append("time signatures (every bar is 4/4)")
    voices = config.additional_params.get(_VOICES_KEY)
    if voices:
        kept.append(f"tracks that share a program apart (up to {voices} a program)")
    else:
        dropped.append("the identity of tracks that share a program (merged into one track)")
    dropped += ["key signatures", "pedals", "pitch bends", "control changes", "track names"]
    return f"tokenizer (REMI): keeps {', '.join(kept)}; drops {', '.join(dropped)}"


def tokenizer_to_json(tokenizer) -> str:
    """The tokenizer's parameters as JSON text (stored in checkpoints and cache keys).

    Keys keep MidiTok's order: it numbers the ``TimeSig`` tokens in the order of
    ``time_signature_range``, so sorting the keys (as versions before this fix did) renumbers
    them when the tokenizer is rebuilt.
    """
    return json.dumps(tokenizer.to_dict(), default=str)


# What MidiTok writes beside a tokenizer's parameters that does not change its tokens: the versions
# of the libraries it runs on (MidiTok's own version stays compared: it defines the vocabulary).
_NOT_PARAMETERS = ("symusic_version", "hf_tokenizers_version")


def same_tokenizer(a: str, b: str) -> bool:
    """Whether two stored tokenizers have the same parameters, whatever their key order and the
    versions of symusic and Hugging Face tokenizers they were saved with (an upgrade of either
    must not make a run's corpus look like another's)."""
    def parameters(text: str) -> dict:
        return {k: v for k, v in json.loads(text).items() if k not in _NOT_PARAMETERS}

    return parameters(a) == parameters(b)


def tokenizer_from_json(text: str):
    """Rebuilds a tokenizer from :func:`tokenizer_to_json` output (stored in checkpoints).

    The library's own tokenizers (:func:`make_tokenizer` with the stored tokenizer's
    :func:`tokenizer_options`, and the one of runs from before them) are rebuilt fresh, so their
    token ids are exactly those of the corpus, also for checkpoints written with sorted keys.
    """
    import tempfile

    from miditok import REMI

    for build in (lambda: make_tokenizer(tokenizer_options(text)), _legacy_tokenizer):
        fresh = build()
        if same_tokenizer(text, tokenizer_to_json(fresh)):
            return fresh
    track_remi = _VOICES_KEY in json.loads(text).get("config", {}).get("additional_params", {})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        path.write_text(text)
        return (_track_remi_class() if track_remi else REMI)(params=path)


def _convert_score(args: tuple[str, str]) -> str | None:
    source, target = args
    from music21 import corpus

    try:
        score = corpus.parse(source)
        atomic_write(target, lambda tmp: score.write("midi", fp=tmp))
        return None
    except Exception as err:  # noqa: BLE001 - one bad score must not stop the corpus
        return f"{source}: {err}"


def bach_chorales_midi(cache_dir: str | os.PathLike | None = None, *, workers: int = 2,
                       progress: bool = True) -> Path:
    """Writes the Bach chorales of music21's corpus as MIDI files, once.

    Returns:
        The folder of ``.mid`` files (``cache_dir/bach-chorales-midi-m21-VERSION``).
    """
    return music21_corpus_midi("bach", cache_dir, workers=workers, progress=progress)


# Score formats of music21's corpus that convert to MIDI (.rntxt files are harmonic analyses).
_SCORE_SUFFIXES = (".mxl", ".xml", ".musicxml", ".krn", ".abc", ".mid", ".midi")


def music21_corpus_midi(composer: str, cache_dir: str | os.PathLike | None = None, *, workers: int = 2,
                        stride: int = 1, progress: bool = True) -> Path:
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
        progress: show a progress bar while converting.

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
                                    desc="music21 -> MIDI", unit="piece", disable=not progress))
        else:
            results = [_convert_score(j) for j in tqdm(jobs, desc="music21 -> MIDI", unit="piece",
                                                       disable=not progress)]
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


def _walk(folder: Path) -> tuple[list[Path], list[Path], list[str]]:
    """MIDI files below ``folder``, following links, each folder and file read once.

    The folder's own tree is walked first and links after it (breadth first), so of two ways
    to one folder or file the one without a link is kept; among links, the first in path order.

    Returns:
        (files sorted, paths left out because they were reached before, paths that cannot be read).
    """
    seen: set[tuple[int, int]] = set()
    files, again, unreadable, linked_files = [], [], [], []

    def first_visit(path: Path) -> bool:
        try:
            st = path.stat()  # through links: two ways to one folder or file share (device, inode)
        except OSError:
            unreadable.append(display_name(path))
            return False
        if (st.st_dev, st.st_ino) in seen:
            again.append(path)
            return False
        seen.add((st.st_dev, st.st_ino))
        return True

    pending = [folder]
    while pending:
        top = pending.pop(0)
        if not first_visit(top):  # links are resolved once every folder before them is marked
            continue
        for dirpath, dirnames, filenames in os.walk(top, onerror=lambda err: unreadable.append(
                display_name(err.filename or folder))):
            here = Path(dirpath)
            pending += sorted(here / d for d in dirnames if (here / d).is_symlink())
            dirnames[:] = [d for d in sorted(dirnames) if not (here / d).is_symlink() and first_visit(here / d)]
            for path in (here / name for name in sorted(filenames)):
                if path.suffix.lower() not in (".mid", ".midi") or not path.is_file():
                    continue
                if path.is_symlink():
                    linked_files.append(path)
                elif first_visit(path):
                    files.append(path)
    files += [path for path in linked_files if first_visit(path)]
    return sorted(files), again, unreadable


def find_midi_files(folder: str | os.PathLike) -> list[Path]:
    """All ``.mid``/``.midi`` files below ``folder`` (any case), sorted.

    Links to folders are followed; a folder or file reached a second time (a link cycle, or a
    second link to something already read) is read once, and a warning counts and names the
    paths left out, as it does folders that cannot be listed.

    Raises:
        DataError: if the folder does not exist or holds no MIDI file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"data folder {display_name(folder)} does not exist or is not a folder")
    files, again, unreadable = _walk(folder)
    if again:
        warnings.warn(f"skipped {len(again)} path(s) in {display_name(folder)} reached a second time through "
                      f"symbolic links (a cycle, or a second link; each folder and file is read once): "
                      f"{shown_names(again)}", stacklevel=2)
    if unreadable:
        warnings.warn(f"skipped {len(unreadable)} path(s) in {display_name(folder)} that cannot be read: "
                      f"{', '.join(unreadable[:5])}",
                      stacklevel=2)
    if not files:
        raise DataError(f"data folder {display_name(folder)} holds no .mid or .midi file")
    return files


def check_max_piece_tokens(value: int) -> int:
    """Returns ``value`` if it is a positive int (bools refused).

    Raises:
        DataError: naming the value.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DataError(f"max_piece_tokens must be a positive number of tokens, got {value!r}")
    return value


def _cache_key(files: list[Path], root: Path, tokenizer_json: str, max_piece_tokens: int) -> str:
    h = hashlib.sha256(tokenizer_json.encode())
    h.update(f"max_piece_tokens={max_piece_tokens}\n".encode())
    for f in files:
        st = f.stat()
        # The name's bytes, so that names that are not UTF-8 hash too.
        h.update(os.fsencode(f.relative_to(root)) + f"\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def _tokenize(path: Path, tokenizer, max_tokens: int) -> tuple[np.ndarray | None, bool]:
    """The REMI ids of one MIDI file, at most ``max_tokens`` of them, and whether it was cropped.

    The ids are always a prefix of the whole piece's. The score is clipped before tokenising
    where it is longer than ``max_tokens × _QUARTERS_PER_TOKEN`` quarters, so a file whose
    events lie absurdly far apart never becomes millions of tokens (its piece then ends at
    its last event before the clip). Returns None for a file without notes.
    """
    from symusic import Score

    score = Score(str(path))
    if not any(len(t.notes) for t in score.tracks):
        return None, False
    limit = max_tokens * _QUARTERS_PER_TOKEN * score.tpq
    clipped = score.end() > limit
    if clipped:
        score = score.clip(0, limit)
    ids = np.asarray(tokenizer.encode(score).ids, dtype=np.int64)
    return ids[:max_tokens], clipped or ids.size > max_tokens


def _read_cache(cache_file: Path, tok_json: str, max_piece_tokens: int) -> Corpus:
    stored = np.load(cache_file, allow_pickle=False)
    names = json.loads(str(stored["names"]))
    cropped = json.loads(str(stored["cropped"])) if "cropped" in stored else []
    lengths = stored["lengths"]
    pieces = np.split(stored["ids"], np.cumsum(lengths)[:-1]) if len(lengths) else []
    log.info("loaded %d tokenised pieces from %s%s", len(names), cache_file,
             f" ({len(cropped)} cropped to max_piece_tokens = {max_piece_tokens})" if cropped else "")
    return Corpus(names=names, pieces=[p.astype(np.int64) for p in pieces], tokenizer_json=tok_json,
                  cropped=cropped)


def _write_cache(cache_file: Path, corpus: Corpus) -> None:
    lengths = np.array([len(p) for p in corpus.pieces], dtype=np.int64)
    flat = np.concatenate(corpus.pieces).astype(np.int32)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, names=np.array(json.dumps(corpus.names)), lengths=lengths, ids=flat,
                     cropped=np.array(json.dumps(corpus.cropped)))

    atomic_write(cache_file, write)


def _data_root(data: str | os.PathLike | None, cache: Path, progress: bool = True) -> Path:
    if data is None:
        return bach_chorales_midi(cache, progress=progress)
    if str(data).startswith(MUSIC21_PREFIX):
        name, stride = _parse_music21(str(data))
        return music21_corpus_midi(name, cache, stride=stride, progress=progress)
    return Path(data)


def load_corpus(data: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None = None,
                progress: bool = True, max_piece_tokens: int = MAX_PIECE_TOKENS,
                tokenizer: TokenizerOptions | str | None = None) -> Corpus:
    """Tokenises a MIDI folder (or the Bach default when ``data`` is None) to REMI.

    Unreadable or corrupt files, and files with no notes, are skipped with a warning that
    names each, and a final count. Pieces longer than ``max_piece_tokens`` keep their first
    ``max_piece_tokens`` tokens (fewer when their events span more than 8 quarters per
    allowed token: the score is cut there before it is tokenised, and the piece ends at its
    last event before the cut), with a warning naming each and a final count (the names are
    in :attr:`Corpus.cropped`).

    Args:
        data: folder of MIDI files, ``music21:NAME`` for a composer or collection of
            music21's corpus (e.g. ``music21:palestrina``), or None for the Bach chorales.
        cache_dir: where converted MIDI and token caches live (default :func:`default_cache_dir`).
        progress: show progress bars (converting music21's scores, tokenising).
        max_piece_tokens: the longest piece kept, in tokens (default :data:`MAX_PIECE_TOKENS`);
            part of the cache key.
        tokenizer: what the tokenizer keeps (:class:`TokenizerOptions`, default: its
            defaults), or a run's stored tokenizer (JSON text, :func:`tokenizer_to_json`),
            which is then used as it is; its parameters are part of the cache key.

    Returns:
        A :class:`Corpus`.

    Raises:
        DataError: missing or empty folder, no readable MIDI file in it, or a
            ``max_piece_tokens`` that is not a positive int.
    """
    from tqdm import tqdm

    check_max_piece_tokens(max_piece_tokens)
    cache = Path(cache_dir or default_cache_dir())
    root = _data_root(data, cache, progress)
    files = find_midi_files(root)
    tokenizer = tokenizer_from_json(tokenizer) if isinstance(tokenizer, str) else make_tokenizer(tokenizer)
    tok_json = tokenizer_to_json(tokenizer)
    cache_file = cache / "tokens" / f"{_cache_key(files, root, tok_json, max_piece_tokens)}.npz"
    if cache_file.exists():
        return _read_cache(cache_file, tok_json, max_piece_tokens)

    corpus, skipped = Corpus(names=[], pieces=[], tokenizer_json=tok_json), 0
    for f in tqdm(files, desc="REMI tokens", unit="file", disable=not progress):
        name = display_name(f.relative_to(root))
        try:
            ids, cropped = _tokenize(f, tokenizer, max_piece_tokens)
        except Exception as err:  # noqa: BLE001 - corrupt files are skipped, named, counted
            warnings.warn(f"skipped unreadable MIDI file {display_name(f)}: {' '.join(str(err).split())}",
                          stacklevel=2)
            skipped += 1
            continue
        if ids is None or ids.size < 2:  # zero-length piece
            warnings.warn(f"skipped MIDI file {display_name(f)}: it has no notes", stacklevel=2)
            skipped += 1
            continue
        if cropped:
            warnings.warn(f"cropped MIDI file {display_name(f)} to its first {ids.size} tokens "
                          f"(max_piece_tokens = {max_piece_tokens})", stacklevel=2)
            corpus.cropped.append(name)
        corpus.names.append(name)
        corpus.pieces.append(ids)
    if skipped:
        warnings.warn(f"skipped {skipped} of {len(files)} MIDI files in {display_name(root)}", stacklevel=2)
    if corpus.cropped:
        warnings.warn(f"cropped {len(corpus.cropped)} of {len(files)} MIDI files in {display_name(root)} to "
                      f"max_piece_tokens = {max_piece_tokens} tokens", stacklevel=2)
    if not corpus.pieces:
        raise DataError(f"no readable MIDI file with notes in {display_name(root)} ({len(files)} tried)")
    _write_cache(cache_file, corpus)
    return corpus

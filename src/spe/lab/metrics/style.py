"""Style profiles and their cosine similarity (Cífka et al. 2019, 2020; appendix C.2, Figure 5).

Appendix C.2 of Liutkus et al. (2021) scores groove continuations by comparing *style
profiles* of the output and of the prompt's source: "each metric gathers musical event
statistics of the two pieces in histograms called style profiles, and then computes the
cosine similarity between them." Figure 5 does so on four successive parts of equal
duration of each output (:func:`split_equal_parts`).

Times are in beats, a beat being a quarter note (``score.tpq`` ticks); the profiles assume
4/4, as the paper's data does ("start(a) mod 4 represents the position of the note onset
relative to the current bar"). Notes of all tracks are pooled, drums included, as in the
reference implementation (groove2groove's ``style_profiles.py``, which reads every note of a
NoteSequence). Needs the ``music`` extra (numpy, symusic).
"""

from __future__ import annotations

import itertools
import math
import operator
from pathlib import Path

import numpy as np

__all__ = ["onset_duration_profile", "split_equal_parts", "style_similarity", "time_pitch_profile"]

# Times on a bin edge (e.g. an onset exactly 1/6 beat after the downbeat) must land in the bin
# that starts there, whatever the rounding of ticks / tpq; 1e-9 bins is far below any MIDI grid.
_EDGE_EPS = 1e-9


def _load(midi):
    """A ``symusic.Score`` in ticks from a Score or a MIDI file path."""
    import symusic
    from symusic.core import ScoreQuarter, ScoreSecond, ScoreTick

    if isinstance(midi, (str, Path)):
        try:
            score = symusic.Score(str(midi))
        except (RuntimeError, ValueError, OSError) as err:
            raise ValueError(f"cannot read MIDI file {str(midi)!r}: {err}") from err
    elif isinstance(midi, (ScoreTick, ScoreQuarter, ScoreSecond)):
        score = midi
    else:
        raise TypeError(f"midi must be a symusic.Score or a path to a MIDI file, got {type(midi).__name__}")
    if not isinstance(score, ScoreTick):
        score = score.to("tick")
    return score


def _notes(midi) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Onsets (ticks, int64), durations (ticks, int64) and pitches (int64) of all tracks, sorted
    by onset, and the ticks per beat."""
    score = _load(midi)
    columns = [track.notes.numpy() for track in score.tracks if len(track.notes)]
    if not columns:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, int(score.tpq)
    time = np.concatenate([c["time"] for c in columns]).astype(np.int64)
    duration = np.concatenate([c["duration"] for c in columns]).astype(np.int64)
    pitch = np.concatenate([c["pitch"] for c in columns]).astype(np.int64)
    order = np.argsort(time, kind="stable")
    return time[order], duration[order], pitch[order], int(score.tpq)


def _check_bins(name: str, bins, span) -> tuple[int, float]:
    try:
        bins = operator.index(bins)
    except TypeError:
        raise TypeError(f"{name} must be an integer number of bins, got {bins!r}") from None
    if bins < 1:
        raise ValueError(f"{name} must be >= 1, got {bins}")
    span = float(span)
    if not (math.isfinite(span) and span > 0):
        raise ValueError(f"the range of {name} must be a positive number of beats, got {span}")
    return bins, span


def _bin_index(beats: np.ndarray, width: float) -> np.ndarray:
    return np.floor(beats / width + _EDGE_EPS).astype(np.int64)


def _normalise(hist: np.ndarray) -> np.ndarray:
    total = hist.sum()
    return hist / total if total > 0 else hist


def onset_duration_profile(midi, *, bins: int = 24, beats: float = 4.0, duration_bins: int = 12,
                           max_duration: float = 2.0) -> np.ndarray:
    """2-D histogram of note onset position in the bar against note duration (appendix C.2).

    Each note a gives (start(a) mod 4, end(a) − start(a)) in beats; the paper gathers these
    "in 24 × 12 histogram bins (24 for onset time and 12 for duration)" over [0, 4) × [0, 2),
    i.e. bins of 1/6 beat on both axes. Bins are half-open [i·w, (i+1)·w), except that a
    duration of exactly ``max_duration`` (a half note, common) counts in the last bin, as in
    the reference implementation (numpy's closed last edge); longer notes are left out.

    Args:
        midi: a ``symusic.Score`` or a path to a MIDI file; notes of all tracks.
        bins: onset bins over one bar.
        beats: bar length in beats (4 for 4/4).
        duration_bins: duration bins over [0, max_duration].
        max_duration: longest duration counted, in beats.

    Returns:
        (bins, duration_bins) float64 profile summing to 1 (all zeros if no note is counted).

    Raises:
        ValueError: if a file cannot be read (naming it) or on non-positive bins or ranges.
        TypeError: if ``midi`` is neither a Score nor a path.
    """
    bins, beats = _check_bins("bins", bins, beats)
    duration_bins, max_duration = _check_bins("duration_bins", duration_bins, max_duration)
    time, duration, _, tpq = _notes(midi)
    onset_bin = _bin_index(np.mod(time / tpq, beats), beats / bins)
    # An onset within rounding of the next downbeat (bin index `bins`) is that downbeat: bin 0.
    onset_bin = np.where(onset_bin >= bins, onset_bin - bins, onset_bin)
    dur_beats = duration / tpq
    dur_bin = _bin_index(dur_beats, max_duration / duration_bins)
    dur_bin = np.where(np.isclose(dur_beats, max_duration, rtol=0, atol=1e-9), duration_bins - 1, dur_bin)
    keep = (dur_bin >= 0) & (dur_bin < duration_bins)
    hist = np.zeros((bins, duration_bins))
    np.add.at(hist, (onset_bin[keep], dur_bin[keep]), 1.0)
    return _normalise(hist)


def time_pitch_profile(midi, *, bins: int = 24, beats: float = 4.0, max_interval: int = 20) -> np.ndarray:
    """2-D histogram of onset time differences against pitch intervals over note pairs (appendix C.2).

    Every ordered pair of distinct notes (a, b) with 0 <= start(b) − start(a) < 4 beats gives
    (start(b) − start(a), pitch(b) − pitch(a)); "the histogram has 24 × 41 bins (24 for time
    lags between 0 and 4 beats and 41 bins for intervals between −20 and 20 semitones)".
    Simultaneous notes give both orders (lag 0, ±interval); intervals beyond ±max_interval
    are left out. Time bins are half-open, of width beats / bins.

    Args:
        midi: a ``symusic.Score`` or a path to a MIDI file; notes of all tracks.
        bins: time-lag bins over [0, beats).
        beats: longest lag, in beats (exclusive).
        max_interval: largest |interval| counted, in semitones.

    Returns:
        (bins, 2·max_interval + 1) float64 profile summing to 1 (all zeros without a pair);
        column j is the interval j − max_interval.

    Raises:
        ValueError: if a file cannot be read (naming it) or on non-positive bins or ranges.
        TypeError: if ``midi`` is neither a Score nor a path.
    """
    bins, beats = _check_bins("bins", bins, beats)
    try:
        max_interval = operator.index(max_interval)
    except TypeError:
        raise TypeError(f"max_interval must be an integer (semitones), got {max_interval!r}") from None
    if max_interval < 0:
        raise ValueError(f"max_interval must be >= 0, got {max_interval}")
    time, _, pitch, tpq = _notes(midi)
    hist = np.zeros((bins, 2 * max_interval + 1))
    # Notes are sorted by onset, so the pairs within `beats` of note i are i+1, i+2, ...: one
    # vectorised pass per index gap, stopping when no pair at that gap is close enough.
    for gap in range(1, len(time)):
        lag = (time[gap:] - time[:-gap]) / tpq  # (n − gap,) beats, >= 0
        close = _bin_index(lag, beats / bins) < bins
        if not close.any():
            break
        lag_bin = _bin_index(lag[close], beats / bins)
        interval = pitch[gap:][close] - pitch[:-gap][close]
        same_onset = lag[close] == 0
        # Later note b minus earlier a; at lag 0 either note may be "b", so count both orders.
        lag_bin = np.concatenate([lag_bin, lag_bin[same_onset]])
        interval = np.concatenate([interval, -interval[same_onset]])
        keep = np.abs(interval) <= max_interval
        np.add.at(hist, (lag_bin[keep], interval[keep] + max_interval), 1.0)
    return _normalise(hist)


def style_similarity(a, b) -> float:
    """Cosine similarity of two style profiles, flattened (appendix C.2).

    Args:
        a: a profile (any shape), e.g. from :func:`time_pitch_profile`.
        b: a profile of the same shape.

    Returns:
        cos(a, b) in [−1, 1] ([0, 1] for histograms); 0.0 if either profile is all zeros
        (no note or pair counted: nothing in common, and no NaN in averages).

    Raises:
        ValueError: if the shapes differ or a profile has NaN/infinite entries.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"profiles must have the same shape, got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("profiles must have finite entries")
    a, b = a.ravel(), b.ravel()
    norm = np.linalg.norm(a) * np.linalg.norm(b)
    if norm == 0:
        return 0.0
    return float(np.clip(a @ b / norm, -1.0, 1.0))


def split_equal_parts(midi, num_parts: int = 4, *, start: int | None = None, end: int | None = None) -> list:
    """Cuts a piece into successive parts of equal duration (Figure 5: "we divide each generated
    sample into four successive chunks of identical duration and evaluate them independently").

    Part i holds the notes (of every track) whose onset lies in [b_i, b_{i+1}), with
    b_i = start + ⌊i·(end − start) / num_parts⌋ ticks; the last part also holds notes starting
    exactly at ``end``. Notes keep their full durations (a note is not cut at a boundary: its
    duration is part of the onset-duration profile) and their absolute times, so onset
    positions in the bar are those of the whole piece.

    Args:
        midi: a ``symusic.Score`` or a path to a MIDI file.
        num_parts: number of parts.
        start: first tick of the span to cut (default: the piece's first event).
        end: last tick of the span (default: the piece's end, the last note offset).

    Returns:
        ``num_parts`` ``symusic.Score`` objects (same tpq, tracks, tempos); a part may have no notes.

    Raises:
        ValueError: if a file cannot be read, num_parts < 1, or end < start.
        TypeError: if ``midi`` is neither a Score nor a path, or bounds are not integers.
    """
    score = _load(midi)
    try:
        num_parts = operator.index(num_parts)
        start = score.start() if start is None else operator.index(start)
        end = score.end() if end is None else operator.index(end)
    except TypeError:
        raise TypeError(f"num_parts, start and end must be integers (ticks), got {num_parts!r}, "
                        f"{start!r}, {end!r}") from None
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if end < start:
        raise ValueError(f"end ({end}) must not be before start ({start})")
    edges = [start + (i * (end - start)) // num_parts for i in range(num_parts + 1)]
    edges[-1] = end + 1  # symusic's clip is half-open; include notes starting exactly at `end`
    return [score.clip(lo, hi, clip_end=False) for lo, hi in itertools.pairwise(edges)]

"""Style profiles (appendix C.2): hand-computed bins, units, files, similarity, equal parts."""

import re

import numpy as np
import pytest
from symusic import Note, Score, Track

from spe.lab.metrics import onset_duration_profile, split_equal_parts, style_similarity, time_pitch_profile

TPQ = 480  # ticks per beat; bins of 1/6 beat are 80 ticks


def _score(*tracks, tpq=TPQ):
    """A score from tracks given as lists of (time, duration, pitch) in ticks."""
    score = Score(tpq)
    for notes in tracks:
        track = Track(program=0)
        for time, duration, pitch in notes:
            track.notes.append(Note(time, duration, pitch, 80))
        score.tracks.append(track)
    return score


# Note a: onset beat 1, half a beat, C4. Note b: onset 13/6 beats (1040 ticks), one beat, G4.
TWO_NOTES = [(480, 240, 60), (1040, 480, 67)]


def test_onset_duration_bins_by_hand():
    p = onset_duration_profile(_score(TWO_NOTES))
    assert p.shape == (24, 12)
    expected = np.zeros((24, 12))
    expected[6, 3] = 0.5  # onset 1 beat / (1/6) = bin 6; duration 0.5 beat / (1/6) = bin 3
    expected[13, 6] = 0.5  # onset 13/6 beats = bin 13; duration 1 beat = bin 6
    np.testing.assert_array_equal(p, expected)


def test_onset_is_taken_modulo_the_bar_and_durations_beyond_two_beats_are_left_out():
    notes = [(4 * TPQ + 240, 80, 60),  # bar 2, beat 0.5: onset bin 3, duration bin 1
             (TPQ, 2 * TPQ, 62),  # exactly 2 beats: the last duration bin (reference code's closed edge)
             (0, 2 * TPQ + 1, 64)]  # longer than 2 beats: not counted
    p = onset_duration_profile(_score(notes))
    expected = np.zeros((24, 12))
    expected[3, 1] = expected[6, 11] = 0.5
    np.testing.assert_array_equal(p, expected)


def test_time_pitch_bins_by_hand():
    p = time_pitch_profile(_score(TWO_NOTES))
    assert p.shape == (24, 41)
    expected = np.zeros((24, 41))
    expected[7, 20 + 7] = 1.0  # the one pair: lag 560 ticks = 7/6 beats = bin 7; interval +7
    np.testing.assert_array_equal(p, expected)


def test_time_pitch_lag_zero_counts_both_orders_and_ranges_are_half_open():
    chord = [(0, 240, 60), (0, 240, 64)]
    p = time_pitch_profile(_score(chord))
    expected = np.zeros((24, 41))
    expected[0, 20 + 4] = expected[0, 20 - 4] = 0.5
    np.testing.assert_array_equal(p, expected)
    # Lag exactly 4 beats is out ([0, 4)); one tick less is the last bin; |interval| 21 is out.
    p = time_pitch_profile(_score([(0, 10, 60), (4 * TPQ, 10, 62), (4 * TPQ - 1, 10, 61), (10, 10, 81)]))
    counted = {tuple(int(i) for i in idx): p[idx] for idx in zip(*np.nonzero(p), strict=True)}
    # Pairs counted: (0→4TPQ−1: bin 23, +1), (4TPQ−1→4TPQ: bin 0, +1), (10→4TPQ−1: bin 23, −20),
    # (10→4TPQ: bin 23, −19); (0→4TPQ) has lag 4 and (0→10) has interval 21.
    assert counted == {(23, 21): 0.25, (0, 21): 0.25, (23, 0): 0.25, (23, 1): 0.25}


def test_tracks_are_pooled_and_units_are_beats():
    one_track = _score(TWO_NOTES)
    two_tracks = _score(TWO_NOTES[:1], TWO_NOTES[1:])
    np.testing.assert_array_equal(time_pitch_profile(two_tracks), time_pitch_profile(one_track))
    np.testing.assert_array_equal(onset_duration_profile(two_tracks), onset_duration_profile(one_track))
    # The same music at 96 ticks per beat gives the same profiles.
    coarse = _score([(t // 5, d // 5, p) for t, d, p in TWO_NOTES], tpq=TPQ // 5)
    np.testing.assert_array_equal(time_pitch_profile(coarse), time_pitch_profile(one_track))
    np.testing.assert_array_equal(onset_duration_profile(coarse), onset_duration_profile(one_track))


def test_profiles_sum_to_one_or_are_zero_without_notes():
    rng = np.random.default_rng(0)
    notes = [(int(t), int(d), int(p)) for t, d, p in zip(rng.integers(0, 20 * TPQ, 200),
                                                         rng.integers(1, 3 * TPQ, 200),
                                                         rng.integers(40, 80, 200), strict=True)]
    for profile in (onset_duration_profile, time_pitch_profile):
        assert profile(_score(notes)).sum() == pytest.approx(1.0, abs=1e-12)
        assert not profile(Score(TPQ)).any()
    assert not time_pitch_profile(_score(TWO_NOTES[:1])).any()  # one note: no pair


def test_files_and_errors(midi_folder, tmp_path):
    path = midi_folder / "piece0.mid"
    score = Score(str(path))
    np.testing.assert_array_equal(time_pitch_profile(path), time_pitch_profile(score))
    np.testing.assert_array_equal(onset_duration_profile(str(path)), onset_duration_profile(score))
    for bad in (midi_folder / "broken.mid", tmp_path / "missing.mid"):
        with pytest.raises(ValueError, match=re.escape(bad.name)):
            onset_duration_profile(bad)
    with pytest.raises(TypeError, match=r"symusic\.Score"):
        time_pitch_profile([(0, 1, 60)])
    with pytest.raises(ValueError, match="bins"):
        time_pitch_profile(score, bins=0)
    with pytest.raises(ValueError, match="beats"):
        onset_duration_profile(score, beats=-4.0)


def test_style_similarity():
    p = time_pitch_profile(_score(TWO_NOTES))
    q = time_pitch_profile(_score([(0, 240, 60), (0, 240, 64)]))
    assert style_similarity(p, p) == pytest.approx(1.0, abs=1e-12)
    assert style_similarity(p, 3 * p) == pytest.approx(1.0, abs=1e-12)
    assert style_similarity(p, q) == 0.0  # disjoint supports
    assert style_similarity(q, q + p) == pytest.approx(0.5 / np.sqrt(0.5 * 1.5), abs=1e-12)  # by hand
    assert style_similarity(p, np.zeros_like(p)) == 0.0
    with pytest.raises(ValueError, match="same shape"):
        style_similarity(p, onset_duration_profile(_score(TWO_NOTES)))


def test_split_equal_parts():
    # One note per beat for 16 beats, the last ending at 16 beats: four parts of 4 beats.
    notes = [(i * TPQ, TPQ, 60 + i) for i in range(16)]
    notes.append((3 * TPQ + 240, 3 * TPQ, 50))  # crosses a part boundary: stays whole in part 0
    parts = split_equal_parts(_score(notes))
    assert len(parts) == 4
    pitches = [sorted(n.pitch for t in part.tracks for n in t.notes) for part in parts]
    assert pitches == [[50, 60, 61, 62, 63], [64, 65, 66, 67], [68, 69, 70, 71], [72, 73, 74, 75]]
    crossing = next(n for n in parts[0].tracks[0].notes if n.pitch == 50)
    assert (crossing.time, crossing.duration) == (3 * TPQ + 240, 3 * TPQ)
    # Times stay absolute.
    assert [n.time for n in parts[1].tracks[0].notes] == [4 * TPQ, 5 * TPQ, 6 * TPQ, 7 * TPQ]
    # A note starting exactly at `end` is kept (in the last part); an empty part is allowed.
    parts = split_equal_parts(_score(notes), 2, start=0, end=15 * TPQ)
    assert sum(len(t.notes) for t in parts[1].tracks) == 8
    assert len(split_equal_parts(Score(TPQ), 3)) == 3
    with pytest.raises(ValueError, match="num_parts"):
        split_equal_parts(_score(notes), 0)
    with pytest.raises(ValueError, match="before start"):
        split_equal_parts(_score(notes), start=10, end=5)

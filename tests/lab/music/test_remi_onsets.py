"""The onset clock (spe.encodings.onset) against MidiTok's own REMI: the onset it gives each note's
Pitch token is the note's onset in the score, through time signature changes and both positions'
sizes (4/4: 1/8 beat; 6/8: 1/16 beat)."""

import random

import torch

from spe.encodings.onset import OnsetClock, onset_tokens, remi_onsets
from spe.lab.music.corpus import make_tokenizer


def test_the_onsets_of_miditoks_pitch_tokens_are_the_scores_note_onsets():
    from symusic import Note, Score, TimeSignature, Track

    rng, tpq = random.Random(0), 480
    score = Score(tpq)
    for time, n, d in ((0, 4, 4), (8 * tpq, 3, 4), (14 * tpq, 6, 8)):  # two 4/4 bars, two 3/4 bars, then 6/8
        score.time_signatures.append(TimeSignature(time, n, d))
    expected = []
    for program in (0, 40):  # two voices in one token stream
        track, t = Track(program=program), 0
        for _ in range(40):
            t += rng.choice([60, 120, 240, 480, 30 if t >= 14 * tpq else 60])  # on REMI's grid
            track.notes.append(Note(t, 120, rng.randint(55, 75), 80))
            expected.append(t / tpq)
        score.tracks.append(track)
    tokenizer = make_tokenizer()
    seq = tokenizer.encode(score)
    seq = seq[0] if isinstance(seq, list) else seq
    assert seq.tokens[0] == "Bar_None"  # the first token is at time 0: the onsets are the score's times
    onsets = remi_onsets(torch.tensor([seq.ids]), tokenizer.vocab)[0]
    got = sorted(float(onsets[i]) for i, name in enumerate(seq.tokens) if name.startswith("Pitch_"))
    assert got == sorted(expected)
    assert OnsetClock(onset_tokens(tokenizer.vocab), len(tokenizer)).resolution == 8

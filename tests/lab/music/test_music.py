"""Data pipeline on a small folder: recursive, case-insensitive, corrupt files named and skipped, cached."""

import warnings

import numpy as np
import pytest

from spe.lab.music.dataset import CropSampler, PitchShifter, prefix_batch
from spe.lab.music.grammar import REMIGrammar
from spe.lab.music.corpus import DataError, find_midi_files, load_corpus, make_tokenizer


def test_folder_is_read_recursively_and_corrupt_files_are_named(midi_folder, tmp_path):
    files = find_midi_files(midi_folder)
    assert {f.name for f in files} == {f"piece{i}.mid" for i in range(6)} | {"UPPER.MIDI", "broken.mid"}
    with pytest.warns(UserWarning) as record:
        corpus = load_corpus(midi_folder, cache_dir=tmp_path / "cache", progress=False)
    messages = [str(w.message) for w in record]
    assert any("broken.mid" in m for m in messages)
    assert any("skipped 1 of 8" in m for m in messages)
    assert sorted(corpus.names) == sorted([f"piece{i}.mid" for i in range(6)] + ["sub/UPPER.MIDI"])
    # Second load comes from the cache: same tokens, no parsing (so no warnings).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = load_corpus(midi_folder, cache_dir=tmp_path / "cache", progress=False)
    assert again.names == corpus.names
    assert all(np.array_equal(a, b) for a, b in zip(again.pieces, corpus.pieces))
    train, val = corpus.split(0.3, seed=0)
    assert sorted(train + val) == list(range(7)) and len(val) == 2 and not set(train) & set(val)


def test_missing_empty_and_unreadable_folders_are_clear_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_corpus(tmp_path / "nope", cache_dir=tmp_path / "c")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no .mid or .midi"):
        load_corpus(tmp_path / "empty", cache_dir=tmp_path / "c")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.mid").write_bytes(b"garbage")
    with pytest.warns(UserWarning), pytest.raises(DataError, match="no readable MIDI"):
        load_corpus(bad, cache_dir=tmp_path / "c", progress=False)


def test_transposition_moves_only_pitches_and_stays_in_range():
    tok = make_tokenizer()
    shifter = PitchShifter(tok.vocab, max_shift=6)
    ids = np.array([tok.vocab[t] for t in ["Bar_None", "Position_0", "Program_0", "Pitch_60", "Velocity_79",
                                           "Duration_1.0.8", "Program_0", "Pitch_105", "Velocity_79"]])
    top = max(int(t.split("_")[1]) for t in tok.vocab if t.startswith("Pitch_"))
    lo, hi = shifter.shift_range(ids)
    assert (lo, hi) == (-6, top - 105)
    up = shifter(ids, top - 105)
    inv = {v: k for k, v in tok.vocab.items()}
    assert [inv[int(i)] for i in up] == ["Bar_None", "Position_0", "Program_0", f"Pitch_{60 + top - 105}", "Velocity_79",
                                         "Duration_1.0.8", "Program_0", f"Pitch_{top}", "Velocity_79"]
    with pytest.raises(ValueError, match="outside"):
        shifter(ids, top - 105 + 1)


def test_crops_have_training_length_and_short_pieces_are_refused():
    import torch

    pieces = [np.arange(100), np.arange(30)]
    crops = CropSampler(pieces, 40).sample(5, torch.Generator().manual_seed(0))
    assert crops.shape == (5, 41) and torch.all(crops[:, 1:] - crops[:, :-1] == 1)
    with pytest.raises(ValueError, match="longer than the training length"):
        CropSampler(pieces, 200)
    assert prefix_batch(pieces, 50).shape == (1, 50)


def test_grammar_follows_remi_and_positions_increase_within_a_bar():
    tok = make_tokenizer()
    g = REMIGrammar(tok)
    v = tok.vocab
    inv = {i: t for t, i in v.items()}
    first = g.allowed_next([])
    assert {inv[i].split("_")[0] for i in first.nonzero().flatten().tolist()} == {"Bar"}
    after_pitch = g.allowed_next([v["Bar_None"], v["TimeSig_4/4"], v["Position_8"], v["Program_0"], v["Pitch_60"]])
    assert {inv[i].split("_")[0] for i in after_pitch.nonzero().flatten().tolist()} == {"Velocity"}
    after_note = g.allowed_next([v["Bar_None"], v["TimeSig_4/4"], v["Position_8"], v["Program_0"], v["Pitch_60"],
                                 v["Velocity_79"], v["Duration_1.0.8"]])
    assert not after_note[v["Position_8"]] and not after_note[v["Position_4"]] and after_note[v["Position_9"]]
    assert after_note[v["Bar_None"]] and not after_note[v["EOS_None"]] and not after_note[v["PAD_None"]]


def test_music21_corpus_names_and_strides_are_parsed_or_refused():
    from spe.lab.music.corpus import DataError, _parse_music21, music21_corpus_midi

    assert _parse_music21("music21:palestrina") == ("palestrina", 1)
    assert _parse_music21("music21:palestrina/4") == ("palestrina", 4)
    for bad in ("music21:palestrina/x", "music21:palestrina/0", "music21:"):
        with pytest.raises(DataError, match="music21:NAME|stride"):
            _parse_music21(bad)
    with pytest.raises(DataError, match="no scores for 'no-such-composer'"):
        music21_corpus_midi("no-such-composer", "/tmp/spe-test-never-written")


@pytest.mark.parametrize("progress", [True, False])
def test_music21_conversion_shows_its_progress_bar_only_when_asked(tmp_path, monkeypatch, capsys, progress):
    # `spe sweep --no-progress` reaches the once-only conversion of a music21 collection
    from pathlib import Path

    from music21 import corpus

    import spe.lab.music.corpus as music

    monkeypatch.setattr(corpus, "getComposer", lambda name: [Path(f"/corpus/{name}/piece{i}.krn") for i in range(3)])
    monkeypatch.setattr(music, "_convert_score", lambda job: Path(job[1]).write_bytes(b"MThd") and None)
    out = music.music21_corpus_midi("fake", tmp_path, workers=1, progress=progress)
    assert sorted(p.name for p in out.glob("*.mid")) == ["piece0.mid", "piece1.mid", "piece2.mid"]
    assert ("music21 -> MIDI" in capsys.readouterr().err) == progress


def test_stored_tokenizer_rebuilds_with_the_corpus_token_ids():
    import json

    from spe.lab.music.corpus import make_tokenizer, same_tokenizer, tokenizer_from_json, tokenizer_to_json

    fresh = make_tokenizer()
    stored = tokenizer_to_json(fresh)
    # sorting the keys (as old checkpoints did) renumbers the time-signature tokens when
    # MidiTok rebuilds the tokenizer from the file; both forms must give the corpus ids
    old_style = json.dumps(fresh.to_dict(), sort_keys=True, default=str)
    for text in (stored, old_style):
        assert same_tokenizer(text, stored)
        assert tokenizer_from_json(text).vocab == fresh.vocab
    assert not same_tokenizer(stored, stored.replace('"use_programs": true', '"use_programs": false'))
    # saved under other symusic / tokenizers releases: the same tokens; another MidiTok: not known to be
    other = json.loads(stored)
    other.update(symusic_version="0.0.1", hf_tokenizers_version="0.0.2")
    assert same_tokenizer(stored, json.dumps(other))
    assert not same_tokenizer(stored, json.dumps({**other, "miditok_version": "0.0.3"}))

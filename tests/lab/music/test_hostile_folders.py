"""Hostile MIDI folders: non-UTF-8 names, folder links and cycles, absurdly long pieces."""

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import write_midi

import spe.lab.music.corpus as music
from spe.lab.music.corpus import MAX_PIECE_TOKENS, DataError, display_name, find_midi_files, load_corpus

# One note, then one 10^7 ticks later at 1 tick per quarter (format 0, 45 bytes). Without a
# bound MidiTok writes a Bar and a TimeSig token for each of its 2.5 M bars: 5 M tokens.
ABSURD_MIDI = (b"MThd\x00\x00\x00\x06\x00\x00\x00\x01\x00\x01"
               b"MTrk\x00\x00\x00\x17"
               b"\x00\x90\x3c\x40" b"\x01\x80\x3c\x40"
               b"\x84\xe2\xad\x00\x90\x3e\x40"  # delta 10^7 as a variable-length quantity
               b"\x01\x80\x3e\x40" b"\x00\xff\x2f\x00")


def _load(root, cache, **kwargs):
    """load_corpus, and the text of every warning it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        corpus = load_corpus(root, cache_dir=cache, progress=False, **kwargs)
    return corpus, [str(w.message) for w in caught]


def test_the_absurd_file_is_45_bytes_of_5_million_tokens():
    from symusic import Score

    assert len(ABSURD_MIDI) == 45
    score = Score.from_midi(ABSURD_MIDI)
    assert score.tpq == 1 and score.note_num() == 2 and score.end() == 10 ** 7 + 2


def test_a_non_utf8_file_name_is_read_and_shown_escaped(tmp_path):
    root = tmp_path / "midi"
    for i in range(2):
        write_midi(root / f"piece{i}.mid", seed=i)
    write_midi(root / "odd.mid", seed=5)
    os.rename(os.fsencode(root / "odd.mid"), os.fsencode(root) + b"/bad\xff.mid")
    corpus, messages = _load(root, tmp_path / "cache")
    assert corpus.names == ["bad\\xff.mid", "piece0.mid", "piece1.mid"] and not messages
    assert display_name(b"bad\xff.mid") == "bad\\xff.mid" == display_name(os.fsdecode(b"bad\xff.mid"))
    again, _ = _load(root, tmp_path / "cache")  # from the cache, whose key hashes the name's bytes
    assert again.names == corpus.names and all(np.array_equal(a, b) for a, b in zip(again.pieces, corpus.pieces))


def test_folder_links_are_followed_once_and_cycles_are_named_and_counted(tmp_path):
    root, outside = tmp_path / "data", tmp_path / "outside"
    write_midi(root / "real" / "a.mid", seed=1)
    write_midi(outside / "b.mid", seed=2)
    (root / "more").symlink_to(outside, target_is_directory=True)  # a folder outside: followed
    (root / "again").symlink_to(root / "real", target_is_directory=True)  # a second way in: left out
    (root / "real" / "loop").symlink_to(root, target_is_directory=True)  # a cycle: left out
    (root / "real" / "twin.mid").symlink_to(root / "real" / "a.mid")  # a second way to a file: left out
    (root / "dangling.mid").symlink_to(tmp_path / "nowhere.mid")
    with pytest.warns(UserWarning) as record:
        files = find_midi_files(root)
    # the real path is kept over the link ("again" sorts before "real")
    assert [f.relative_to(root).as_posix() for f in files] == ["more/b.mid", "real/a.mid"]
    (message,) = [str(w.message) for w in record]
    assert message.startswith(f"skipped 3 path(s) in {root} reached a second time through symbolic links")
    for name in ("data/again", "real/loop", "real/twin.mid"):
        assert name in message


def test_a_45_byte_file_is_cropped_before_it_is_tokenised(tmp_path, monkeypatch):
    root = tmp_path / "midi"
    write_midi(root / "piece.mid", notes=60)
    (root / "absurd.mid").write_bytes(ABSURD_MIDI)
    encoded = []
    make = music.make_tokenizer

    def recording_tokenizer(*options):
        tokenizer = make(*options)
        encode = tokenizer.encode
        tokenizer.encode = lambda score: encoded.append(len(encode(score).ids)) or encode(score)
        return tokenizer

    monkeypatch.setattr(music, "make_tokenizer", recording_tokenizer)
    corpus, messages = _load(root, tmp_path / "cache", max_piece_tokens=1000)
    assert corpus.names == ["absurd.mid", "piece.mid"] and corpus.cropped == ["absurd.mid"]
    # The score is clipped at 8 quarters per allowed token, before its second note: what is
    # left is the first note (8 tokens with its tempo), a prefix of the whole piece's tokens, and MidiTok
    # never sees the 2.5 M empty bars.
    vocab = {i: t for t, i in music.make_tokenizer().vocab.items()}
    assert [vocab[int(i)].split("_")[0] for i in corpus.pieces[0]] == [
        "Bar", "TimeSig", "Position", "Tempo", "Program", "Pitch", "Velocity", "Duration"]
    assert max(encoded) <= 8 * 1000
    assert f"cropped MIDI file {root / 'absurd.mid'} to its first 8 tokens (max_piece_tokens = 1000)" in messages
    assert f"cropped 1 of 2 MIDI files in {root} to max_piece_tokens = 1000 tokens" in messages


def test_the_default_bound_crops_the_absurd_file(tmp_path):
    root = tmp_path / "midi"
    write_midi(root / "piece.mid", notes=60)
    (root / "absurd.mid").write_bytes(ABSURD_MIDI)
    corpus, messages = _load(root, tmp_path / "cache")
    assert MAX_PIECE_TOKENS == 65_536 and len(corpus.pieces[0]) == 8 and corpus.cropped == ["absurd.mid"]
    assert f"cropped 1 of 2 MIDI files in {root} to max_piece_tokens = 65536 tokens" in messages


def test_cropping_keeps_the_first_tokens_and_the_bound_is_part_of_the_cache_key(tmp_path):
    root = tmp_path / "midi"
    write_midi(root / "a.mid", notes=60)
    write_midi(root / "b.mid", notes=15, seed=3)
    whole, messages = _load(root, tmp_path / "cache")
    lengths = [len(p) for p in whole.pieces]
    assert whole.cropped == [] and not messages and lengths[1] < 100 < lengths[0]
    for bound in (100, lengths[1] - 1, 100):  # a changed bound tokenises again; the same one reads its cache
        cropped, _ = _load(root, tmp_path / "cache", max_piece_tokens=bound)
        assert all(np.array_equal(c, w[:bound]) for c, w in zip(cropped.pieces, whole.pieces))
        assert cropped.cropped == ["a.mid"] + (["b.mid"] if bound < lengths[1] else [])
    assert len(list((tmp_path / "cache" / "tokens").glob("*.npz"))) == 3


@pytest.mark.parametrize("bound", [0, -5, 1.5, True, "100"])
def test_a_bad_bound_is_refused_naming_it(tmp_path, bound):
    with pytest.raises(DataError, match=f"max_piece_tokens must be a positive number of tokens, got {bound!r}"):
        load_corpus(tmp_path, cache_dir=tmp_path / "cache", max_piece_tokens=bound)


@pytest.mark.slow
def test_the_tokenised_pieces_are_those_of_before_for_ordinary_files(midi_folder, tmp_path):
    """Clipping only ever applies to pieces above the bound: ordinary files tokenise as MidiTok does."""
    from symusic import Score

    corpus, _ = _load(midi_folder, tmp_path / "cache")
    tokenizer = music.make_tokenizer()
    for name, ids in zip(corpus.names, corpus.pieces):
        assert np.array_equal(ids, tokenizer.encode(Score(str(Path(midi_folder) / name))).ids)

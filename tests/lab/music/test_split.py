"""The 16× protocol's test split (the gates study): long pieces held out before the training / validation
split, never trained or validated on, evaluated in buckets of L up to 16 L by ``spe evaluate --split test``.

Scaled down: L = 8, so 16 L + 1 = 129 tokens; pieces of 10-20 notes are shorter, of 26-46 notes longer.
"""

import json
import warnings

import numpy as np
import pytest
from conftest import write_midi
from tiny_run import tiny_config

from spe.lab.music.corpus import DataError, load_corpus
from spe.lab.music.split import hold_out_test_pieces, load_split, split_of_run
from spe.lab.music.config import TrainConfig

L = 8
MIN_TOKENS = 16 * L + 1
SHORT_NOTES = (10, 12, 14, 16, 18, 20)  # 54-106 tokens
LONG_NOTES = (26, 30, 34, 38, 42, 46)  # 138-245 tokens


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(folder, cache) of 12 pieces, 6 of them at least MIN_TOKENS long."""
    root = tmp_path_factory.mktemp("long")
    for i, notes in enumerate(SHORT_NOTES + LONG_NOTES):
        write_midi(root / "midi" / f"piece{i:02d}.mid", seed=i, notes=notes)
    return str(root / "midi"), str(root / "cache")


def _keys(pieces) -> set[bytes]:
    return {np.asarray(p, dtype="<i8").tobytes() for p in pieces}


def test_the_test_pieces_are_long_held_out_and_the_same_whatever_the_split_seed(corpus):
    data, cache = corpus
    split = load_split(data, cache_dir=cache, test_min_tokens=MIN_TOKENS, num_test_pieces=3)
    test, train, val = _keys(split.test_pieces), _keys(split.train_pieces), _keys(split.val_pieces)
    assert len(split.test_pieces) == len(test) == 3
    assert all(len(p) >= MIN_TOKENS for p in split.test_pieces)
    assert not test & (train | val)
    assert len(train) + len(val) + len(test) == 12  # nothing else lost
    again = load_split(data, cache_dir=cache, test_min_tokens=MIN_TOKENS, num_test_pieces=3, split_seed=5)
    assert _keys(again.test_pieces) == test  # not the split seed's choice: every run tests on the same pieces
    assert split.test_min_tokens == MIN_TOKENS


def test_a_split_without_a_test_split_is_the_one_runs_made_before(corpus):
    data, cache = corpus
    whole = load_corpus(data, cache_dir=cache, progress=False)
    for seed in (0, 3):
        train_idx, val_idx = whole.split(0.25, seed)  # the split of spe before test splits
        for split in (load_split(data, cache_dir=cache, val_fraction=0.25, split_seed=seed),
                      load_split(data, cache_dir=cache, val_fraction=0.25, split_seed=seed, test_min_tokens=0)):
            assert [p.tobytes() for p in split.train_pieces] == [whole.pieces[i].tobytes() for i in train_idx]
            assert [p.tobytes() for p in split.val_pieces] == [whole.pieces[i].tobytes() for i in val_idx]
            assert split.test_pieces == []


def test_the_choice_depends_on_the_pieces_only_and_holds_out_copies():
    rng = np.random.default_rng(0)
    pieces = [rng.integers(0, 300, size=n) for n in (50, 200, 60, 300, 250, 220, 40)]
    pieces.append(pieces[3].copy())  # the same score twice
    assert hold_out_test_pieces(pieces, 200, 4) == ([1, 3, 4, 5], [0, 2, 6])  # 7, a copy of 3, in neither
    test, rest = hold_out_test_pieces(pieces, 200, 3)  # 3 of the 4 distinct long pieces: the hash chooses
    assert len(test) == 3 and all(len(pieces[i]) >= 200 for i in test)
    assert not _keys(pieces[i] for i in test) & _keys(pieces[i] for i in rest)
    order = [5, 7, 0, 2, 6, 1, 4, 3]  # the same pieces in another order
    shuffled, _ = hold_out_test_pieces([pieces[i] for i in order], 200, 3)
    assert _keys(pieces[i] for i in test) == _keys(pieces[order[i]] for i in shuffled)


def test_too_few_long_pieces_is_an_error_naming_the_corpus_the_count_and_the_longest(corpus):
    data, cache = corpus
    with pytest.raises(DataError, match=rf"{data}: 6 .*{MIN_TOKENS} tokens.*longest has 2\d\d.*num_test_pieces = 7.*test_min_tokens"):
        load_split(data, cache_dir=cache, test_min_tokens=MIN_TOKENS, num_test_pieces=7)
    with pytest.raises(DataError, match=r"need at least 2 pieces.*got 1 \(after holding out 11 test pieces\)"):
        load_split(data, cache_dir=cache, test_min_tokens=50, num_test_pieces=11)  # every piece is that long


@pytest.mark.parametrize(("options", "message"), [  # each option's own range: tests/lab/music/test_option_rules.py
    ({"test_min_tokens": L + 1}, "test_min_tokens 9 leaves no test position beyond seq_len 8"),
    ({"test_min_tokens": MIN_TOKENS, "max_piece_tokens": 100}, "test_min_tokens 129 exceeds max_piece_tokens 100"),
])
def test_test_pieces_too_short_to_test_anything_are_refused_before_any_data_is_read(options, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(seq_len=L, **options)


def test_training_never_crops_a_test_piece(corpus, tmp_path):
    from spe.lab.music.task import LMTask

    data, cache = corpus
    cfg = tiny_config(tmp_path, "run", data=data, cache_dir=cache, seq_len=L, test_min_tokens=MIN_TOKENS,
                      num_test_pieces=3)
    task = LMTask(cfg, progress=False)
    task._load_data(progress=False)
    test = _keys(task.split.test_pieces)
    assert len(test) == 3
    assert not test & _keys(task.sampler.pieces)  # the pieces crops are drawn from
    assert not test & _keys(task.split.val_pieces)
    assert len(task.sampler.pieces) == len(task.split.train_pieces) == 8


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    from spe.lab.music.train import train

    data, cache = corpus
    cfg = tiny_config(tmp_path_factory.mktemp("run"), "run", data=data, cache_dir=cache, seq_len=L, steps=2,
                      test_min_tokens=MIN_TOKENS, num_test_pieces=3)
    train(cfg, progress=False)
    return cfg


@pytest.mark.slow
def test_evaluate_split_test_reads_the_test_pieces_in_buckets_of_l_up_to_16_l(trained, tmp_path, capsys):
    from spe.lab.cli.main import main

    cfg = trained
    expected = load_split(cfg.data, cache_dir=cfg.cache_dir, test_min_tokens=MIN_TOKENS, num_test_pieces=3)
    pieces = split_of_run(cfg.to_dict(), split="test")
    assert pieces.evaluated == "test" and _keys(pieces.val_pieces) == _keys(expected.test_pieces)
    out = tmp_path / "eval"
    assert main(["evaluate", "--checkpoint", cfg.out, "--split", "test", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["split"], summary["num_validation_pieces"], summary["num_sequences"]) == ("test", 3, 3)
    assert summary["max_length"] == 16 * L  # the default on the test split: every test piece's length
    buckets = summary["models"][0]["buckets"]
    assert [(b["start"], b["end"]) for b in buckets] == [(k * L, (k + 1) * L) for k in range(16)]
    assert "3 sequences of 128 positions from the test pieces" in capsys.readouterr().out
    assert (out / "extrapolation.png").stat().st_size > 0


@pytest.mark.slow
def test_a_run_without_a_test_split_says_so_and_its_options_cannot_change_on_resume(trained, tmp_path):
    from spe.lab.music.status import run_status

    old = {k: v for k, v in trained.to_dict().items() if k not in ("test_min_tokens", "num_test_pieces")}
    with pytest.raises(ValueError, match=r"the run holds no test split .*sets test_min_tokens"):
        split_of_run(old, split="test")
    other = TrainConfig.from_dict({**trained.to_dict(), "num_test_pieces": 4})
    assert run_status(other).train_differences == {"num_test_pieces": (3, 4)}


def test_fewer_than_three_validation_pieces_are_warned_with_the_fraction_that_gives_three(corpus):
    data, cache = corpus
    with pytest.warns(UserWarning, match=r"1 validation piece.* of 12 .*0\.05.*--val-fraction 0\.21.* 3"):
        load_split(data, cache_dir=cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_split(data, cache_dir=cache, val_fraction=0.21).val_pieces) == 3


def test_val_fraction_is_a_flag_checked_before_any_work(tmp_path, capsys):
    from spe.lab.cli.main import main

    assert main(["train", "--val-fraction", "1", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == "spe train: error: --val-fraction must be a number in (0, 1), got 1.0"
    assert not (tmp_path / "run").exists()

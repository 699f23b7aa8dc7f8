"""spe evaluate on a folder of the user's evaluates every piece of it; --split chooses; JSON is strict."""

import json

import pytest
from tiny_run import clean_midi, tiny_config

from spe.lab.cli.main import main
from spe.lab.music.split import same_data
from spe.lab.music.train import train


def _strict(path) -> dict:
    def refuse(constant):
        raise AssertionError(f"{path} holds {constant}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    cfg = tiny_config(tmp, "run", steps=2, model={"positional": "ape", "attention": "softmax"})
    train(cfg, progress=False)
    return tmp, cfg


@pytest.mark.parametrize(("which", "split", "expected", "pieces"), [
    ("own", None, "validation", 1),  # the run's own data: its held-out piece (1 of 6)
    ("own", "train", "train", 5),
    ("own", "all", "all", 6),
    ("user", None, "all", 4),  # another folder: every piece of it
    ("user", "validation", "validation", 1),  # 5 % of 4 pieces, at least one
])
@pytest.mark.slow
def test_which_pieces_are_evaluated(trained, which, split, expected, pieces, tmp_path, capsys):
    tmp, cfg = trained
    data = cfg.data if which == "own" else str(clean_midi(tmp_path / "user", pieces=4))
    out = tmp_path / "eval"
    argv = ["evaluate", "--checkpoint", cfg.out, "--data", data, "--cache-dir", cfg.cache_dir,
            "--max-length", "48", "--out", str(out), "--json", str(out / "buckets.json"), "--no-progress"]
    assert main(argv + (["--split", split] if split else [])) == 0
    summary = _strict(out / "summary.json")
    counts = (summary["split"], summary["num_validation_pieces"], summary["num_sequences"])
    assert counts == (expected, pieces, pieces)
    assert f"from the {expected} pieces" in capsys.readouterr().out
    _strict(out / "buckets.json")
    if pieces == 1:  # the spread over one sequence does not exist: null, not NaN
        assert summary["models"][0]["within_std"] is None
    else:
        assert summary["models"][0]["within_std"] > 0


def test_same_data_compares_resolved_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "midi").mkdir()
    assert same_data("midi", str(tmp_path / "midi") + "/")
    assert same_data(None, None) and not same_data("midi", None)
    assert same_data("music21:bach", "music21:bach") and not same_data("music21:bach", "midi")


def test_strict_json_writes_null_for_non_finite_floats():
    from spe.lab.strict_json import dumps

    assert json.loads(dumps({"a": float("nan"), "b": [1.5, float("inf")], "c": (float("-inf"),)})) == \
        {"a": None, "b": [1.5, None], "c": [None]}

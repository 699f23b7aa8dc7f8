"""``spe synth``: the configuration's refusals, --write-data, plans, and one tiny run (slow)."""

import json
import logging

import pytest

from spe import DecoderLM, ModelConfig
import torch

from spe.lab.cli.main import main
from spe.lab.synth import preset_config
from spe.lab.plans import load_plan, packaged_plans
from spe.lab.synth.data import IGNORE, READ
from spe.lab.synth.run import train_seed
from spe.lab.synth.study import row_config
from spe.lab.synth.task import SynthTask, correct_count, fixed_split
from spe.lab.experiment import quiet_defaults


def _refused(capsys, argv: list[str], fragment: str) -> None:
    assert main(["synth", *argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and fragment in err, err


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--task", "copy"], "unknown synthetic task 'copy'"),
    (["--task", "flip-flop", "--eval-lengths", "64,0"], "positive integers"),
    (["--task", "flip-flop", "--eval-lengths", "64,x"], "comma-separated integers"),
    (["--task", "flip-flop", "--eval-lengths", "65"], "even number of tokens"),
    (["--task", "flip-flop", "--eval-lengths", "8192"], "exceeds 64 × seq_len = 4096"),
    (["--task", "mqar", "--train-length", "63"], "seq_len must be an even number"),
    (["--task", "flip-flop", "--steps", "0"], "--steps must be a positive integer, got 0"),
    (["--task", "flip-flop", "--positional", "nope"], "unknown positional encoding 'nope'"),
    (["--task", "flip-flop", "--positional", "ape-learned", "--max-positions", "256"], "length 4096 exceeds the 256"),
    (["--task", "mqar", "--threads", "-1"], "--threads must be 0 (PyTorch's default) or a positive number"),
    (["--eval-lengths", "64"], "give --task"),
    (["--plan", "learned-time-mqar", "--positional", "rope"], "plan sets --positional per row"),
    (["--only", "ape"], "give --plan"),
    (["--plan", "no-such-plan"], "neither a file nor a packaged plan"),
])
def test_bad_commands_are_refused_in_one_line(capsys, argv, fragment):
    _refused(capsys, argv, fragment)


def test_flags_reach_the_model_and_the_preset_fills_the_rest():
    cfg = preset_config("flip-flop", model={"positional": "none", "attention": "softmax", "decay": "gated"},
                        eval_lengths=[64, 128])
    assert (cfg.model["d_model"], cfg.model["num_layers"], cfg.model["num_heads"]) == (128, 2, 4)
    assert cfg.model["decay"] == "gated" and cfg.p_ignore == 0.8 and cfg.batch_size == 32
    assert preset_config("mqar").model["attention_window"] == 64  # sineSPE's window of L, as spe train's


def test_write_data_round_trips_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "data"
    argv = ["synth", "--task", "mqar", "--eval-lengths", "64,128", "--write-data", str(out), "--seeds", "3"]
    assert main(argv) == 0
    cfg = preset_config("mqar", eval_lengths=[64, 128])
    vocab = json.loads((out / "vocab.json").read_text())
    assert vocab["tokens"] == cfg.vocab() and vocab["seeds"]["train"] == 3
    assert vocab["pairs"]["more-pairs"] == {"64": 8, "128": 11}
    assert vocab["seeds"]["validation-128"] != vocab["seeds"]["test-same-pairs-128"]
    for name, split, length in (("validation", "same-pairs", 64), ("validation-128", "same-pairs", 128),
                                ("test-more-pairs-128", "more-pairs", 128)):
        rows = [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
        tokens, targets = fixed_split(cfg, "test" if name.startswith("test") else "validation", split, length)
        assert torch.equal(torch.tensor([r["tokens"] for r in rows]), tokens)
        assert torch.equal(torch.tensor([r["targets"] for r in rows]), targets)
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    task, gens = SynthTask(cfg), {"data": torch.Generator().manual_seed(3)}  # the engine's data generator of seed 3
    first = task.batch(gens, _one_process(), torch.device("cpu"))
    assert len(train) == 1024 and [r["tokens"] for r in train[:32]] == first[0].tolist()
    assert all(t == IGNORE or t > cfg.num_keys for r in train for t in r["targets"])
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    capsys.readouterr()
    _refused(capsys, argv[1:], "already holds")
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # nothing written beside DIR


def _one_process():
    from spe.lab.engine.distributed import Distributed

    return Distributed()


def test_accuracy_counts_only_the_target_positions():
    cfg = preset_config("flip-flop", eval_lengths=[64])
    tokens, targets = fixed_split(cfg, "validation", "in-distribution", 64)

    class Oracle(torch.nn.Module):  # predicts every next token exactly, or the wrong bit at reads
        def __init__(self, flip: bool):
            super().__init__()
            self.flip = flip

        def forward(self, x):
            nxt = torch.cat([x[:, 1:], x[:, :1]], dim=1)
            nxt = torch.where(self.flip & (x == READ), 7 - nxt, nxt)  # after r: bits 3 <-> 4
            return torch.nn.functional.one_hot(nxt, 5).float()

    right = correct_count(Oracle(False), tokens, targets, batch_tokens=200, device=torch.device("cpu"))
    wrong = correct_count(Oracle(True), tokens, targets, batch_tokens=200, device=torch.device("cpu"))
    n = int((targets != IGNORE).sum())
    assert right == (n, n) and wrong == (0, n)


def test_packaged_plans_hold_the_studys_rows_and_each_builds():
    assert set(packaged_plans("synth")) >= {"learned-time-flip-flop", "learned-time-mqar"}
    for name in ("learned-time-flip-flop", "learned-time-mqar"):
        plan = load_plan(name, "synth")
        assert list(plan.rows) == ["ape", "sinespe", "sinespe-gated", "gated", "gated-channel",
                                   "sinespe-gated-channel", "fox", "rope", "foxpro", "path",
                                   "path-fox", "rope-learned", "rope-learned-gated", "sinespe-learned",
                                   "sinespe-learned-gated", "sinespe-learned-gated-channel",
                                   "sinespe-learned-linear-gated"]
        for row in plan.rows:  # a misspelt option or an impossible pair fails here, not in a run
            DecoderLM(ModelConfig(**{**row_config(plan, row).model, "vocab_size": 16}))
        fox = row_config(plan, "fox", steps=7)
        assert (fox.model["attention"], fox.model["decay"], fox.model["positional"], fox.steps) == \
            ("softmax", "gated", "none", 7)
        assert row_config(plan, "sinespe-gated").model["attention_window"] == 0  # no window: the confound removed
        assert row_config(plan, "sinespe").model["attention_window"] == 64
        # the index twin differs from the learned-time row in its clock only
        twin, learned = (row_config(plan, r).model for r in ("sinespe-gated-channel", "sinespe-learned-gated-channel"))
        assert {k: v for k, v in learned.items() if k != "spe_time"} == twin and learned["spe_time"] == "learned"


def test_a_plan_row_with_a_bad_option_is_named(tmp_path):
    plan = tmp_path / "p.toml"
    plan.write_text('task = "mqar"\n[rows.a]\nmodel = { positional = "ape" }\n[rows.b]\nnum_pairs = 99\n')
    with pytest.raises(ValueError, match=r"row 'b': num_pairs 99 does not fit"):
        load_plan(str(plan), "synth")


@pytest.mark.slow
def test_a_tiny_run_writes_its_results_and_skips_finished_seeds(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["synth", "--task", "flip-flop", "--steps", "3", "--eval-every", "2", "--eval-lengths", "64,128",
            "--d-model", "16", "--num-layers", "1", "--seeds", "0,1", "--out", str(out), "--threads", "1",
            "--no-progress"]
    assert main(argv) == 0
    result = json.loads((out / "seed1" / "result.json").read_text())
    assert result["train_tokens"] == 3 * 32 * 64 and result["params"] > 0 and result["seed"] == 1
    assert set(result["test"]) == {"in-distribution", "sparse", "dense"}
    assert set(result["test"]["sparse"]) == {"64", "128"} and 0 <= result["test"]["dense"]["128"]["accuracy"] <= 1
    summary = json.loads((out / "results.json").read_text())
    assert summary["accuracy"]["dense"]["128"]["seeds"] == 2
    stamp = (out / "seed0" / "result.json").stat().st_mtime_ns
    assert main(argv) == 0  # finished seeds are read back, not trained again
    assert (out / "seed0" / "result.json").stat().st_mtime_ns == stamp
    capsys.readouterr()
    _refused(capsys, [a if a != "16" else "32" for a in argv[1:]], "holds another synthetic-task experiment")


@pytest.mark.slow
def test_grown_eval_lengths_test_finished_seeds_at_the_new_lengths_as_a_fresh_run_would(tmp_path, capsys):
    def run(out, lengths: str, *extra: str) -> int:
        return main(["synth", "--task", "mqar", "--steps", "2", "--d-model", "16", "--num-layers", "1", "--seeds", "0",
                     "--out", str(out), "--eval-lengths", lengths, "--threads", "1", "--no-progress", *extra])

    out, seed = tmp_path / "grown", tmp_path / "grown" / "seed0"
    assert run(out, "64,128") == 0
    first = json.loads((seed / "result.json").read_text())
    weights, metrics = (seed / "model.safetensors").stat().st_mtime_ns, (seed / "metrics.jsonl").read_text()
    assert run(out, "64,128,256") == 0
    grown = json.loads((seed / "result.json").read_text())
    assert (seed / "model.safetensors").stat().st_mtime_ns == weights  # no training step taken
    assert (seed / "metrics.jsonl").read_text() == metrics
    # the provenance is of the process that tested the new lengths, under the grown configuration
    assert grown["provenance"]["config_sha256"] != first["provenance"]["config_sha256"]
    cells_of = ("test", "validation", "provenance")
    kept = {k: v for k, v in grown.items() if k not in cells_of}
    assert kept == {k: v for k, v in first.items() if k not in cells_of}
    for distribution, cells in first["test"].items():
        assert {n: grown["test"][distribution][n] for n in cells} == cells  # stored cells kept as they were
    assert list(first["validation"]) == ["128"] and grown["validation"]["128"] == first["validation"]["128"]
    assert run(tmp_path / "fresh", "64,128,256") == 0  # the same seed asked for every length at once
    fresh = json.loads((tmp_path / "fresh" / "seed0" / "result.json").read_text())
    assert grown["test"] == fresh["test"] and grown["validation"] == fresh["validation"]
    assert sorted(grown["validation"], key=int) == ["128", "256"]  # validated beyond L only: L is val_accuracy's
    older = dict(grown)  # a result from before the validation beyond L: validated, nothing else redone
    del older["validation"]
    (seed / "result.json").write_text(json.dumps(older))
    assert run(out, "64,128,256") == 0
    again = json.loads((seed / "result.json").read_text())
    assert again.pop("provenance")["config_sha256"] == grown.pop("provenance")["config_sha256"]
    assert again == grown
    assert (seed / "model.safetensors").stat().st_mtime_ns == weights
    assert json.loads((out / "config.json").read_text())["eval_lengths"] == [64, 128, 256]
    assert json.loads((out / "results.json").read_text())["accuracy"]["more-pairs"]["256"]["seeds"] == 1
    capsys.readouterr()
    assert run(out, "64,256") == 2  # a stored length dropped
    assert "eval_lengths may only grow" in capsys.readouterr().err
    assert run(out, "64,128,256,512", "--steps", "3") == 2  # another model than the stored cells measured
    assert "holds another synthetic-task experiment (steps 2 -> 3)" in capsys.readouterr().err
    refused = json.loads((seed / "result.json").read_text())
    refused.pop("provenance")
    assert refused == grown
    lengths = {"eval_lengths": [64, 128, 256, 512]}
    with pytest.raises(ValueError, match="test lengths .*same steps"):
        train_seed(preset_config("mqar", steps=3, **lengths), 0, seed)
    bare = tmp_path / "bare" / "seed0"  # a result whose checkpoints are gone: nothing to test
    bare.mkdir(parents=True)
    (bare / "result.json").write_text(json.dumps(grown))
    with pytest.raises(ValueError, match="holds no checkpoint to test at"):
        train_seed(preset_config("mqar", steps=2, **lengths), 0, bare)


@pytest.mark.slow
def test_a_plan_runs_its_rows_into_one_folder_and_collects_them(tmp_path, capsys):
    plan = tmp_path / "tiny.toml"
    plan.write_text('task = "mqar"\nseeds = [0]\n[defaults]\neval_lengths = [64, 128]\n[defaults.model]\n'
                    'd_model = 16\nnum_layers = 1\n[rows.ape]\nmodel = { positional = "ape" }\n'
                    '[rows.fox]\nmodel = { positional = "none", attention = "softmax", decay = "gated" }\n')
    out = tmp_path / "out"
    argv = ["synth", "--plan", str(plan), "--steps", "2", "--out", str(out), "--threads", "1", "--no-progress"]
    assert main([*argv, "--only", "fox"]) == 0
    assert json.loads((out / "results.json").read_text())["rows"]["ape"]["results"] == []
    assert main(argv) == 0  # the other runner: fox is finished, ape runs
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [len(rows[r]["results"]) for r in ("ape", "fox")] == [1, 1]
    assert rows["fox"]["accuracy"]["more-pairs"]["128"]["seeds"] == 1
    assert (out / "ape" / "seed0" / "result.json").is_file() and "## same-pairs" in (out / "results.md").read_text()
    capsys.readouterr()
    _refused(capsys, [*argv[1:-1], "--only", "nope"], "unknown row(s) nope")


def test_long_test_splits_hold_at_most_eval_tokens():
    cfg = preset_config("mqar", eval_lengths=[64, 1024, 4096])
    assert [len(fixed_split(cfg, "test", "more-pairs", t)[0]) for t in (64, 1024, 4096)] == [128, 128, 32]
    assert len(fixed_split(cfg, "validation", "same-pairs", 64)[0]) == 128
    # beyond L the validation split is as large as a test split, and other sequences than the test's
    assert [len(fixed_split(cfg, "validation", "same-pairs", t)[0]) for t in (1024, 4096)] == [128, 32]
    validation, test = (fixed_split(cfg, split, "same-pairs", 1024)[0] for split in ("validation", "test"))
    assert not torch.equal(validation, test)
    small = preset_config("flip-flop", eval_lengths=[64, 256], eval_tokens=1000, eval_examples=10)
    assert [small.examples_at(t) for t in (64, 256, 4096)] == [10, 3, 1]


def test_quick_plans_hold_the_full_plans_rows_and_each_twin_differs_in_one_option():
    for quick, full in (("learned-time-flip-flop-quick", "learned-time-flip-flop"),
                        ("learned-time-mqar-quick", "learned-time-mqar")):
        q, f = load_plan(quick, "synth"), load_plan(full, "synth")
        assert list(q.rows)[:len(f.rows)] == list(f.rows)
        for row in f.rows:
            assert row_config(q, row).model == row_config(f, row).model
            assert row_config(q, row).eval_lengths == row_config(f, row).eval_lengths == [64, 256, 1024, 4096]
    plan = load_plan("learned-time-mqar-quick", "synth")
    for shifted, twin in (("gated-shift", "gated"), ("sinespe-learned-gated-shift", "sinespe-learned-gated")):
        a, b = row_config(plan, shifted).model, row_config(plan, twin).model
        assert a.pop("kv_shift") is True and not b.get("kv_shift", False)
        assert a == {k: v for k, v in b.items() if k != "kv_shift"}
    a, b = (row_config(plan, r).model for r in ("sinespe-learned-gated-shift-spe-gating", "sinespe-learned-gated-shift"))
    assert a.pop("gated") is True and not b.get("gated", False)  # SPE's own gating (eq. 23-25) is the one change
    assert a == {k: v for k, v in b.items() if k != "gated"}
    wide = row_config(plan, "sinespe-learned-gated-shift-spe-gating-r128").model
    assert wide.pop("num_realizations") == 128
    assert {**a, "gated": True} == {**wide, "num_realizations": a["num_realizations"]}
    open_ = row_config(plan, "sinespe-learned-gated-shift-spe-gating-d088").model
    assert open_.pop("gate_init") == 2.0 and open_ == {**a, "gated": True}


def test_reading_a_plan_announces_no_default_and_the_run_of_a_row_announces_its_own(caplog):
    caplog.set_level(logging.INFO, logger="spe.lab.model_defaults")
    plan = load_plan("learned-time-mqar-quick", "synth")  # rows of every kind, sineSPE's windowed one among them
    assert not [r for r in caplog.records if "window" in r.getMessage()]
    quiet = row_config(plan, "foxpro")
    assert not caplog.records  # FoX-Pro has no default to fill: nothing may claim a window for it
    loud = row_config(plan, "sinespe")
    assert [r.getMessage() for r in caplog.records] == [
        "sinespe: sliding attention window of 64 positions (the training length; attention_window 0 "
        "or --attention-window 0 for the whole past)"]
    assert loud.model["attention_window"] == 64 and quiet.model.get("attention_window") is None
    caplog.clear()
    with quiet_defaults():  # the same defaults, filled without a word
        assert row_config(plan, "sinespe").model == loud.model
    assert not caplog.records


def test_the_training_length_is_seq_len_and_train_length_its_old_name_everywhere(tmp_path, caplog):
    from spe.lab.synth.run import open_experiment
    from spe.lab.engine.run_folder import mark_run

    caplog.set_level(logging.INFO)
    assert preset_config("flip-flop", train_length=32, eval_lengths=[32]).seq_len == 32  # a keyword
    assert "train_length is the old name of seq_len" in caplog.text
    from spe.lab.synth.config import SynthConfig

    assert SynthConfig(task="flip-flop", train_length=32, eval_lengths=[32]).seq_len == 32  # the constructor too
    plan = tmp_path / "p.toml"  # a plan row
    plan.write_text('task = "flip-flop"\n[rows.a]\ntrain_length = 32\neval_lengths = [32, 64]\n')
    assert row_config(load_plan(str(plan), "synth"), "a").seq_len == 32
    with pytest.raises(ValueError, match=r"train_length is the old name of seq_len.*both"):
        preset_config("flip-flop", train_length=32, seq_len=32)
    cfg = preset_config("flip-flop", seq_len=32, eval_lengths=[32])  # a folder of before the rename resumes
    stored = {k: v for k, v in cfg.to_dict().items() if k != "seq_len"}
    (tmp_path / "old").mkdir()
    mark_run(tmp_path / "old", "synth")
    (tmp_path / "old" / "config.json").write_text(json.dumps({**stored, "train_length": 32}))
    open_experiment(tmp_path / "old", cfg)
    (tmp_path / "other").mkdir()
    mark_run(tmp_path / "other", "synth")
    (tmp_path / "other" / "config.json").write_text(json.dumps({**stored, "train_length": 16}))
    with pytest.raises(ValueError, match=r"seq_len 16 -> 32"):
        open_experiment(tmp_path / "other", cfg)

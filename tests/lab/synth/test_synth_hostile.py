"""``spe synth`` against hostile inputs: every case refused in one line (exit 2) or handled, nothing lost."""

import json
import tracemalloc

import pytest

from spe.lab.cli.main import main
from spe.lab.synth import preset_config, run_synth, write_data
from spe.lab.plans import load_plan
from spe.lab.synth import run as synth_run
from spe.lab.synth.run import open_experiment


def _refused(capsys, argv: list[str], fragment: str | tuple[str, ...]) -> str:
    """The one-line error of ``spe synth argv``, asserted to hold ``fragment`` (each of them, for a tuple)."""
    capsys.readouterr()
    assert main(["synth", *argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    fragments = (fragment,) if isinstance(fragment, str) else fragment
    assert len(err.strip().splitlines()) == 1 and all(f in err for f in fragments), err
    return err


def _tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("name", ["results.md", "results.json", "config.json"])
def test_an_experiment_folder_of_another_tool_is_refused_and_kept(tmp_path, capsys, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("[1, 2]\n")  # another tool's file; a JSON list for config.json
    _refused(capsys, ["--task", "flip-flop", "--steps", "1", "--out", str(out)], f"holds no spe results but {name}")
    assert _tree(out) == [name] and (out / name).read_text() == "[1, 2]\n"


def test_a_plan_folder_of_another_tool_is_refused_and_kept(tmp_path, capsys):
    plan = tmp_path / "tiny.toml"
    plan.write_text('task = "mqar"\nseeds = [0]\n[rows.ape]\nmodel = { positional = "ape" }\n')
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"mine": true}\n')
    _refused(capsys, ["--plan", str(plan), "--steps", "1", "--out", str(out)], "holds no spe results but results.json")
    assert _tree(out) == ["results.json"]


def test_a_broken_config_of_an_experiment_is_named(tmp_path):
    out = tmp_path / "out"
    cfg = preset_config("flip-flop", steps=2)
    open_experiment(out, cfg)
    (out / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"out/config.json .*spe synth.*JSON array"):
        open_experiment(out, cfg)


def test_other_steps_on_an_experiment_are_refused_naming_both_values(tmp_path):
    out = tmp_path / "out"
    open_experiment(out, preset_config("flip-flop", steps=2))
    before = (out / "config.json").read_text()
    with pytest.raises(ValueError, match=r"holds another synthetic-task experiment \(steps 2 -> 3\)"):
        open_experiment(out, preset_config("flip-flop", steps=3))
    open_experiment(out, preset_config("flip-flop", steps=2, device="cpu"))  # the same options: resumed
    assert (out / "config.json").read_text() == before


def _fake_train(cfg, seed, folder, *, progress=True):
    cells = {str(n): {"accuracy": 0.5 + seed / 10, "targets": 10} for n in cfg.eval_lengths}
    return {"task": cfg.task, "seed": seed, "steps": cfg.steps, "test": {d: dict(cells) for d in
                                                                       ("in-distribution", "sparse", "dense")}}


def test_the_summary_covers_every_seed_in_the_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(synth_run, "train_seed", _fake_train)
    cfg, out = preset_config("flip-flop", steps=2, eval_lengths=[64]), tmp_path / "out"
    run_synth(cfg, [0], out, progress=False)
    summary = run_synth(cfg, [1, 2], out, progress=False)  # another runner, disjoint seeds
    assert [r["seed"] for r in summary["results"]] == [0, 1, 2]
    stored = json.loads((out / "results.json").read_text())
    assert stored["accuracy"]["sparse"]["64"]["seeds"] == 3
    assert "| out | 3 |" in (out / "results.md").read_text()


@pytest.mark.parametrize(("options", "message"), [
    ({"num_keys": 10 ** 8}, "num_keys 100,000,000 exceeds the limit of 65,536"),
    ({"num_values": 10 ** 6}, "num_values 1,000,000 exceeds the limit of 65,536"),
    ({"batch_size": 10 ** 7}, "a training batch's logits needs"),
    ({"eval_batch_tokens": 10 ** 12}, "an evaluation batch's logits needs"),
    ({"eval_examples": 10 ** 12}, "the largest fixed split needs"),
])
def test_sizes_beyond_memory_are_refused_before_any_work(options, message):
    with pytest.raises(ValueError, match=message):
        preset_config("mqar", **options)


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--task", "mqar", "--train-length", "4", "--eval-lengths", "4"],
     ("seq_len 4", "MQAR", "seq_len ≥ 8")),
    (["--task", "flip-flop", "--write-data", ""], "--write-data is empty: give a folder"),
])
def test_unclear_values_are_named(capsys, argv, fragment):
    _refused(capsys, argv, fragment)


def test_write_data_into_a_file_says_a_folder_is_expected(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    _refused(capsys, ["--task", "flip-flop", "--write-data", str(tmp_path / "f")], "f is a file, not a folder")
    assert _tree(tmp_path) == ["f"]


@pytest.mark.parametrize(("text", "message"), [
    ('[rows.a]\nmodel = 5\n', r"synth plan .*p.toml, row 'a': model must be a table of options .*got 5"),
    ('[defaults]\nmodel = "ape"\n[rows.a]\n', r"p.toml: model of \[defaults\] must be a table of options"),
])
def test_a_plan_model_that_is_not_a_table_names_file_row_and_key(tmp_path, text, message):
    plan = tmp_path / "p.toml"
    plan.write_text('task = "mqar"\n' + text)
    with pytest.raises(ValueError, match=message):
        load_plan(str(plan), "synth")


@pytest.mark.parametrize("existing", [False, True])
def test_write_data_that_fails_leaves_nothing_behind(tmp_path, monkeypatch, existing):
    real, calls = synth_run._write_lines, []

    def fails_third(path, batches):
        calls.append(path.name)
        if len(calls) == 3:
            raise MemoryError
        real(path, batches)

    monkeypatch.setattr(synth_run, "_write_lines", fails_third)
    folder = tmp_path / "new" / "data"
    if existing:
        folder.mkdir(parents=True)
        (folder / "mine.txt").write_text("kept")
    with pytest.raises(MemoryError):
        write_data(preset_config("flip-flop", eval_lengths=[64]), folder)
    assert _tree(tmp_path) == (["new", "new/data", "new/data/mine.txt"] if existing else [])


def test_write_data_streams_the_sequences(tmp_path):
    cfg = preset_config("flip-flop", train_length=1024, eval_lengths=[1024], eval_examples=8, eval_tokens=8192)
    tracemalloc.start()
    try:
        write_data(cfg, tmp_path / "data", train_examples=512)  # 512 Ki tokens to train.jsonl
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (tmp_path / "data" / "train.jsonl").stat().st_size > 2_000_000
    assert peak < 4_000_000  # Python objects of one sequence at a time, not of the whole split (~30 MB before)

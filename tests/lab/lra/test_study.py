"""LRA study plans (spe lra --plan): the packaged ListOps plan, plan errors, and a tiny study run end to end."""

import json
import math
import signal
import statistics

import pytest
import torch
from tiny_run import hold_lock

import spe.lab.lra.run as run_module
from spe.lab.cli.main import main
from spe.lab.lra.data.dataset import SequenceDataset
from spe.lab.lra import build_classifier, preset_config
from spe.lab.lra.study import row_config
from spe.lab import plans
from spe.lab.plans import load_plan, packaged_plans
from spe.lab.engine.metrics_log import read_records
from spe.lab.engine.run_folder import RunFolderBusy

TINY_PLAN = """
title = "tiny study"
task = "listops"
seeds = [0, 1]
reference = "ape"
groups = { base = "Base rows", more = "More rows" }

[defaults]
steps = 3
eval_every = 1
batch_size = 4
eval_batch_size = 8
eval_examples = 0
warmup_steps = 1
keep_checkpoints = 1
data_options = { num_train = 24, num_val = 8, num_test = 8, max_depth = 3, max_args = 3, min_length = 5, max_length = 40 }

[defaults.model]
d_model = 16
num_heads = 2
num_layers = 1
d_ff = 16
num_realizations = 4
num_sines = 2
num_features = 8
dropout = 0.0

[rows.ape]
group = "base"
description = "APE"
positional = "ape"
attention = "performer"

[rows.sine]
group = "more"
description = "sineSPE, ungated, positional lr × 2"
positional = "sinespe"
attention = "performer"
positional_lr_scale = 2.0
model = { gated = false }

[rows.never]
group = "more"
description = "a row nobody runs"
positional = "none"
attention = "performer"
"""


def test_the_packaged_listops_plan_is_the_controlled_study():
    assert "listops-study" in packaged_plans("lra")
    plan = load_plan("listops-study", "lra")
    assert (plan.task, plan.preset, plan.seeds, plan.reference, plan.baseline) == \
        ("listops", "cpu-small", [0, 1, 2], "ape-performer", "sinespe-performer")
    assert list(plan.groups) == ["decomposition", "features", "ablation", "peers", "pipeline", "gates"]
    decomposition = {(r["attention"], r["positional"]) for r in plan.rows.values() if r["group"] == "decomposition"}
    assert {("softmax", "ape"), ("softmax", "sinespe-exact"), ("softmax", "sinespe"), ("performer", "sinespe"),
            ("softmax", "convspe-exact"), ("softmax", "convspe"), ("performer", "convspe"),
            ("performer", "ape")} <= decomposition
    configs = {name: row_config(plan, name) for name in plan.rows}
    ablation = [configs[n] for n, r in plan.rows.items() if r["group"] == "ablation"]
    assert {c.model["num_realizations"] for c in ablation} >= {32, 64, 128}
    assert {c.model.get("code_noise") for c in ablation} >= {"orthogonal"}
    assert {c.model["gated"] for c in ablation} == {True, False}
    assert {c.model["share_across_layers"] for c in ablation} == {True, False}
    assert {c.model.get("frequency_init", "low") for c in ablation} == {"low", "spread"}
    assert {c.positional_lr_scale for c in ablation} >= {0.1, 1.0, 10.0}
    assert {configs[n].positional for n, r in plan.rows.items() if r["group"] == "peers"} >= {"lrpe", "permute",
                                                                                                "cosformer"}
    assert {c.listops_pipeline for c in configs.values()} == {"lossless", "lra-2021"}
    # the study's SPE rows train with a fresh code per step unless they say otherwise, whatever
    # the preset now holds (its fix, fixed_code = true)
    spe_rows = {n: c for n, c in configs.items() if c.positional in ("sinespe", "convspe")}
    assert {n for n, c in spe_rows.items() if c.model["fixed_code"]} == \
        {"fixed-code", "convspe-fixed-code", "fixed-code-linear-relu", "ungated-fixed-code"}
    assert preset_config("listops", "sinespe", "performer").model["fixed_code"] is True
    # no two rows train the same experiment
    dumps = [json.dumps(c.to_dict(), sort_keys=True) for c in configs.values()]
    assert len(set(dumps)) == len(dumps)


@pytest.mark.slow
def test_every_row_of_the_packaged_plan_builds_its_model():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = SequenceDataset(torch.randint(2, 19, (4, 40), generator=g), torch.full((4,), 40),
                           torch.randint(0, 10, (4,), generator=g), vocab_size=19, num_classes=10)
    plan = load_plan("listops-study", "lra")
    for name in plan.rows:
        cfg = row_config(plan, name)
        model = build_classifier(cfg, data)
        assert model(data.tokens, data.lengths).shape == (4, 10), name


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.replace('positional = "ape"\n', ""), "row 'ape': give positional"),
    (lambda t: t.replace('description = "APE"', 'description = "APE"\nlr = -1'), "row 'ape': .*lr must be a finite number > 0, got -1"),
    (lambda t: t.replace("gated = false", "gated = 2"), "row 'sine': model option gated must be true or false"),
    (lambda t: t.replace('description = "APE"', 'description = "APE"\nwarp = 9'), "row 'ape': unknown LRA options"),
    (lambda t: t.replace('description = "APE"', 'description = "APE"\ntask = "text"'),
     "row 'ape': task is set once for the whole plan"),
    (lambda t: t.replace('reference = "ape"', 'reference = "apex"'), "reference 'apex' is not one of its rows"),
    (lambda t: t.replace('reference = "ape"', 'reference = "ape"\nbaseline = "sin"'),
     "baseline 'sin' is not one of its rows"),
    (lambda t: t.replace('title = "tiny study"', 'tittle = "x"'), "unknown top-level key\\(s\\) \\['tittle'\\]"),
    (lambda t: t.split("[rows.ape]")[0], "has no \\[rows.NAME\\] tables"),
    (lambda t: t + "\n[[", "is not valid TOML"),
    # plan names become folders under --out: never a path
    *[(lambda t, n=name: t.replace("[rows.never]", f"[rows.{n}]"), f"row .*: the name .* {problem}")
      for name, problem in (('"../../x"', "holds a path separator"), ('".."', "holds '..'"), ('"/tmp/x"', "separator"),
                            ('""', "is empty"), ('"."', "starts with a dot"), ('".hidden"', "starts with a dot"),
                            ('"a\\tb"', "unprintable"), ('"results.json"', "is a file the sweep writes"),
                            ('"results.md"', "is a file the sweep writes"),
                            ('"' + "x" * 300 + '"', "is 300 bytes long, more than the 255"))],
])
def test_plan_mistakes_name_the_file_and_the_row(tmp_path, edit, message):
    path = tmp_path / "plan.toml"
    path.write_text(edit(TINY_PLAN))
    with pytest.raises(ValueError, match=message):
        load_plan(str(path), "lra")


def _expected_step_seconds(folders):
    intervals = []
    for folder in folders:
        step, seconds = 0, 0.0
        for r in read_records(folder / "metrics.jsonl"):
            intervals.append((r["seconds"] - seconds) / (r["step"] - step))
            step, seconds = r["step"], r["seconds"]
    return statistics.median(intervals)


@pytest.mark.slow
def test_a_tiny_study_runs_resumes_and_reports_what_has_not_run(tmp_path, monkeypatch, capsys):
    plan_file = tmp_path / "tiny.toml"
    plan_file.write_text(TINY_PLAN)
    plan, out = load_plan(str(plan_file), "lra"), tmp_path / "study"
    empty = plans.collect_results(plan, out)  # nothing has run: every row "not run", no crash, no plot
    assert [r["status"] for r in empty["rows"]] == ["not run"] * 3 and not (out / "loss.png").exists()
    # two runners on disjoint rows (the second through the command line, one thread), then a collection
    plans.run(plan, out, only=["ape"], progress=False)
    assert main(["-q", "lra", "--plan", str(plan_file), "--out", str(out), "--only", "sine", "--threads", "1",
                 "--no-progress"]) == 0
    assert "| sine |" in capsys.readouterr().out
    assert main(["-q", "lra", "--plan", str(plan_file), "--out", str(out), "--collect"]) == 0
    doc = json.loads((out / "results.json").read_text())
    rows = {r["name"]: r for r in doc["rows"]}
    assert [rows[n]["status"] for n in ("ape", "sine", "never")] == ["done", "done", "not run"]
    for name in ("ape", "sine"):
        results = [json.loads((out / name / f"seed{s}" / "result.json").read_text()) for s in (0, 1)]
        accs = [100 * r["test_accuracy"] for r in results]
        row = rows[name]
        assert row["seeds"] == [0, 1] and row["test_accuracy"] == accs
        assert row["mean"] == pytest.approx((accs[0] + accs[1]) / 2)
        # sample std (n − 1) of two values: |a − b| / √2 (see tests/lab/test_stats.py)
        assert row["std"] == pytest.approx(abs(accs[0] - accs[1]) / math.sqrt(2))
        assert row["best_val_mean"] == pytest.approx(50 * (results[0]["val_accuracy"] + results[1]["val_accuracy"]))
        assert row["step_seconds"] == pytest.approx(_expected_step_seconds([out / name / "seed0", out / name / "seed1"]))
        curves = [[(r["step"], r["train_loss"]) for r in read_records(out / name / f"seed{s}" / "metrics.jsonl")]
                  for s in (0, 1)]
        assert [s for s, _ in row["loss_curve"]] == [1, 2, 3]
        assert [v for _, v in row["loss_curve"]] == pytest.approx([(a[1] + b[1]) / 2 for a, b in zip(*curves)])
    assert row["options"]["positional_lr_scale"] == 2.0
    assert json.loads((out / "sine" / "config.json").read_text())["positional_lr_scale"] == 2.0
    md = (out / "results.md").read_text()
    assert "## Base rows" in md and "## More rows" in md
    never = next(line for line in md.splitlines() if line.startswith("| never |"))
    assert "not run" in never
    sine = next(line for line in md.splitlines() if line.startswith("| sine |"))
    assert f"**{rows['sine']['mean']:.2f} ± {rows['sine']['std']:.2f}**" in sine
    assert "mean ± sample std (n − 1) over seeds; – for one seed" in md
    assert f"{rows['sine']['mean'] - rows['ape']['mean']:+.2f}" in sine
    assert (out / "loss.png").stat().st_size > 0
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporary file

    def no_training(cfg, splits, seed, folder, **kw):
        if not (folder / "result.json").exists():
            pytest.fail(f"{folder} was trained again")
        return json.loads((folder / "result.json").read_text())

    monkeypatch.setattr(run_module, "train_seed", no_training)
    again = plans.run(plan, out, only=["ape", "sine"], progress=False)
    assert [r["test_accuracy"] for r in again["rows"]] == [r["test_accuracy"] for r in doc["rows"]]


def test_the_study_table_recomputes_the_sample_std_of_an_older_results_file():
    from spe.lab.lra.study_results import study_markdown

    def row(name, accs, std):
        return {"name": name, "group": "g", "description": "", "positional": "ape", "attention": "performer",
                "changes": {}, "status": "done", "seeds": list(range(len(accs))), "test_accuracy": accs,
                "mean": sum(accs) / len(accs), "std": std, "best_val_mean": 20.0, "step_seconds": 0.1}

    # written before the convention: 3 seeds [24.1, 26.0, 26.1] with their population std (0.92); the
    # sample std is √(Σ(a − 25.4)² / 2) = √(2.54 / 2) = 1.127; one seed: std null, written "–"
    doc = {"title": "t", "task": "listops", "preset": "cpu-small", "seeds": [0, 1, 2], "reference": "old",
           "groups": {"g": "G"}, "rows": [row("old", [24.1, 26.0, 26.1], statistics.pstdev([24.1, 26.0, 26.1])),
                                          row("one", [20.0], None)]}
    lines = study_markdown(doc).splitlines()
    assert "**25.40 ± 1.13**" in next(line for line in lines if line.startswith("| old |"))
    assert "**20.00 ± –** | -5.40 |" in next(line for line in lines if line.startswith("| one |"))


def test_runner_errors_before_any_run(tmp_path, capsys):
    plan_file = tmp_path / "tiny.toml"
    plan_file.write_text(TINY_PLAN)
    with pytest.raises(ValueError, match="unknown row\\(s\\) nope of study plan"):
        plans.run(load_plan(str(plan_file), "lra"), tmp_path / "out", only=["nope"])
    assert main(["lra", "--plan", str(plan_file), "--positional", "ape"]) == 2
    assert "a study plan sets --positional per row" in capsys.readouterr().err
    assert main(["lra", "--collect"]) == 2
    err = capsys.readouterr().err
    assert "--only and --collect" in err and "--plan" in err
    assert not (tmp_path / "out").exists()


def test_a_folder_of_another_tools_results_is_refused_before_any_row_folder_is_made(tmp_path):
    plan_file = tmp_path / "tiny.toml"
    plan_file.write_text(TINY_PLAN)
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "results.json").write_text('{"theirs": true}')
    with pytest.raises(ValueError, match="results.json"):
        plans.run(load_plan(str(plan_file), "lra"), out, only=["ape"], progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]
    assert (out / "results.json").read_text() == '{"theirs": true}'


@pytest.mark.slow
def test_a_study_runner_is_refused_a_seed_another_process_holds(tmp_path):
    plan_file = tmp_path / "tiny.toml"
    plan_file.write_text(TINY_PLAN)
    seed0 = tmp_path / "study" / "ape" / "seed0"
    holder = hold_lock(seed0)
    try:
        with pytest.raises(RunFolderBusy, match=rf"seed0 .*in use.*PID {holder.pid}"):
            plans.run(load_plan(str(plan_file), "lra"), tmp_path / "study", only=["ape"], progress=False)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert sorted(p.name for p in seed0.iterdir()) == [".lock"]  # the holder's: nothing of ours was written

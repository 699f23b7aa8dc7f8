"""spe.lab.lra: one training step per task × kernel × encoding, the schedule, best checkpoints,
results over seeds, resumption, and the ``spe lra`` command."""

import json
import math

import pytest
import torch
from tiny_run import TINY_LRA_MODEL, lra_dataset, lra_splits, table_rows, tiny_lra_config

from spe.lab.cli.main import main
from spe.lab.lra import LRAConfig, build_classifier, preset_config, run_lra
from spe.lab.lra.task import engine_settings
from spe.lab.lra.train import train_seed
from spe.lab.engine.optim import learning_rate_factor

STEP_CASES = [(task, attention, positional)
              for task in ("listops", "text", "retrieval", "image")
              for attention in ("performer", "linear-relu", "softmax")
              for positional in (("ape-learned", "sinespe", "convspe-2d", "none") if task == "image"
                                 else ("ape", "sinespe", "convspe", "none"))]


@pytest.mark.parametrize("task,attention,positional", STEP_CASES)
def test_one_training_step_per_task_kernel_and_encoding(task, attention, positional, tmp_path):
    """One step of the engine (spe lra's code path): a positive finite loss, and every part learns."""
    from safetensors.torch import load_file

    train = lra_dataset(task)
    cfg = LRAConfig(task=task, positional=positional, attention=attention, model=TINY_LRA_MODEL, batch_size=4, steps=1,
                    eval_every=1)
    torch.manual_seed(0)  # the engine builds the model of seed s right after torch.manual_seed(s)
    model = build_classifier(cfg, train)
    assert (model.config.interaction == "nli") == (task == "retrieval")
    before = model.state_dict()
    train_seed(cfg, {"train": train, "val": train, "test": train}, 0, tmp_path, progress=False)
    loss = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["train_loss"]
    assert math.isfinite(loss) and loss > 0
    after = load_file(str(tmp_path / "last" / "model.safetensors"))
    moved = [k for k, v in after.items() if not torch.equal(v, before[k])]
    assert any(k.startswith("blocks.0.attn.qkv") for k in moved) and any(k.startswith("head") for k in moved)
    if positional in ("sinespe", "convspe", "convspe-2d"):  # the encoding's own parameters learn too
        assert any(k.startswith("encoding") for k in moved) and "blocks.0.attn.spe_filter.gate_logits" in moved


def _factor(step: int, cfg: LRAConfig) -> float:
    """lr(step) / lr as the engine computes it from the settings of ``cfg``."""
    s = engine_settings(cfg, 0)
    return learning_rate_factor(step, steps=s.steps, warmup_steps=s.warmup_steps, schedule=s.schedule,
                                min_lr_ratio=s.min_lr_ratio)


def test_learning_rate_schedules():
    cosine = LRAConfig(task="listops", positional="ape", attention="performer", steps=110, warmup_steps=10)
    assert _factor(0, cosine) == pytest.approx(0.1)
    assert _factor(9, cosine) == pytest.approx(1.0)
    assert _factor(60, cosine) == pytest.approx(0.5)  # halfway through the cosine
    assert _factor(110, cosine) == pytest.approx(0.0, abs=1e-12)  # LRA's cosine ends at 0
    rsqrt = LRAConfig(task="listops", positional="ape", attention="performer", schedule="rsqrt", warmup_steps=10)
    assert _factor(39, rsqrt) == pytest.approx(0.5)  # sqrt(10 / 40), LRA's rsqrt_decay


def test_a_seed_keeps_its_best_validation_checkpoint_and_tests_it(tmp_path):
    from spe.checkpoint import load, load_metadata
    from spe.lab.lra import accuracy

    splits = lra_splits()
    result = train_seed(tiny_lra_config(), splits, 0, tmp_path / "seed0", progress=False)
    records = [json.loads(line) for line in (tmp_path / "seed0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4]
    best = max(records, key=lambda r: (r["val_accuracy"], -r["step"]))  # the first of the highest
    meta = load_metadata(tmp_path / "seed0" / "best")
    assert (meta["step"], meta["val_accuracy"]) == (best["step"], best["val_accuracy"]) == \
        (result["best_step"], result["val_accuracy"])
    assert result["test_accuracy"] == accuracy(load(tmp_path / "seed0" / "best").model, splits["test"])


@pytest.mark.slow
def test_an_interrupted_seed_resumes_to_the_same_weights(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from spe.lab.lra.task import LRATask

    splits = lra_splits()
    whole = train_seed(tiny_lra_config(), splits, 0, tmp_path / "whole", progress=False)
    calls = {"n": 0}
    original = LRATask.loss

    def interrupted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # after the validation at step 2
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LRATask, "loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_seed(tiny_lra_config(), splits, 0, tmp_path / "cut", progress=False)
    monkeypatch.setattr(LRATask, "loss", original)
    cut = train_seed(tiny_lra_config(), splits, 0, tmp_path / "cut", progress=False)
    assert {k: v for k, v in cut.items() if k != "seconds"} == {k: v for k, v in whole.items() if k != "seconds"}
    a, b = (load_file(str(tmp_path / f / "last" / "model.safetensors")) for f in ("whole", "cut"))
    for name, value in a.items():
        torch.testing.assert_close(b[name], value, rtol=0, atol=0)
    # the running training loss is part of the checkpoint: the resumed records are the uninterrupted ones
    records = [[{k: v for k, v in json.loads(line).items() if k != "seconds"}
                for line in (tmp_path / f / "metrics.jsonl").read_text().splitlines()] for f in ("whole", "cut")]
    assert records[0] == records[1]


@pytest.mark.slow
def test_results_over_seeds_and_finished_seeds_are_not_rerun(tmp_path, monkeypatch):
    import spe.lab.lra.data.tasks as tasks
    import spe.lab.lra.run as run_module

    monkeypatch.setattr(tasks, "load_task", lambda *a, **k: lra_splits())
    summary = run_lra(tiny_lra_config(), [0, 1], tmp_path, progress=False)
    accs = [100 * r["test_accuracy"] for r in summary["results"]]
    assert summary["seeds"] == [0, 1] and summary["mean"] == pytest.approx(sum(accs) / 2)
    # sample std of two values: deviations ±|a − b|/2 from the mean, squares summed |a − b|²/2, / (n − 1 = 1)
    assert summary["std"] == pytest.approx(abs(accs[0] - accs[1]) / math.sqrt(2))
    assert "± " in (tmp_path / "results.md").read_text()
    monkeypatch.setattr(run_module, "train_seed", lambda cfg, splits, seed, folder, **k:
                        json.loads((folder / "result.json").read_text()) if (folder / "result.json").exists()
                        else pytest.fail(f"seed {seed} was trained again"))
    again = run_lra(tiny_lra_config(), [0, 1], tmp_path, progress=False)
    assert again["results"] == summary["results"]
    # a later seed joins the folder's summary (the rule's repeats: --seeds 3,4 after 0,1,2)
    monkeypatch.setattr(run_module, "train_seed", lambda cfg, splits, seed, folder, **k: {
        **summary["results"][0], "seed": seed, "test_accuracy": 0.25})
    more = run_lra(tiny_lra_config(), [2], tmp_path, progress=False)
    assert more["seeds"] == [0, 1, 2] and more["results"][:2] == summary["results"]
    assert more["results"][2]["test_accuracy"] == 0.25
    assert json.loads((tmp_path / "results.json").read_text())["seeds"] == [0, 1, 2]
    assert "| 2 | 25.00 |" in (tmp_path / "results.md").read_text()
    with pytest.raises(ValueError, match="another LRA experiment"):
        run_lra(tiny_lra_config(steps=6), [0], tmp_path, progress=False)


def test_one_seed_has_no_std_and_is_written_as_a_dash():
    from spe.lab import strict_json
    from spe.lab.lra.run import _markdown, summarize

    one = [{"seed": 3, "test_accuracy": 0.25, "val_accuracy": 0.3, "best_step": 2, "steps": 4, "seconds": 1.0}]
    summary = summarize(one)
    assert summary["mean"] == 25.0 and summary["std"] is None  # null in results.json, never NaN
    assert json.loads(strict_json.dumps(summary))["std"] is None
    assert "Test accuracy 25.00 ± – % over 1 seed(s)" in _markdown(tiny_lra_config(), summary, one)
    assert summarize([])["mean"] is None and summarize([])["std"] is None


def test_presets_merge_task_positional_and_explicit_options():
    paper = preset_config("listops", "sinespe", "performer", preset="paper")
    assert (paper.model["d_model"], paper.model["num_layers"], paper.model["num_sines"]) == (512, 6, 10)
    assert paper.model["share_across_layers"] is False and paper.model["gated"] is True
    conv = preset_config("listops", "convspe", "performer", preset="paper", steps=7, model={"d_model": 64})
    assert conv.model["share_across_layers"] is True and conv.steps == 7 and conv.model["d_model"] == 64
    small = preset_config("listops", "ape", "performer")
    assert small.data_options["drop_parentheses"] is True and small.steps < paper.steps


@pytest.mark.slow
def test_the_command_end_to_end_on_the_embedded_image_proxy(tmp_path, capsys, monkeypatch):
    # cpu-small image preset cut to 2 steps: trains, picks the best checkpoint, tests it,
    # writes results and the CLS attention map. The proxy's splits are cut to 24 images each
    # (evaluating 350 images of 1,025 tokens would dominate the test's time).
    from spe.lab.lra.data import proxies

    full = proxies.image_proxy
    monkeypatch.setattr(proxies, "image_proxy", lambda **k: {name: split.subset(range(24))
                                                             for name, split in full(**k).items()})
    code = main(["-q", "lra", "--task", "image", "--positional", "convspe-2d", "--attention", "linear-relu",
                 "--steps", "2", "--eval-every", "1", "--out", str(tmp_path), "--no-progress", "--threads", "1"])
    assert code == 0
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["seeds"] == [0] and 0 <= summary["mean"] <= 100
    assert (tmp_path / "seed0" / "best" / "model.safetensors").is_file()
    assert (tmp_path / "attention_seed0.png").stat().st_size > 1000
    assert "Test accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--task", "image", "--preset", "huge"], "unknown LRA preset 'huge'"),
    (["--task", "listops", "--positional", "fourier"], "unknown positional encoding 'fourier'"),
    (["--task", "text", "--positional", "shaw", "--attention", "performer"], "attention scores"),
    (["--task", "text", "--seeds", "0,x"], "--seeds"),
])
def test_the_command_reports_bad_choices_in_one_line(argv, message, capsys, tmp_path):
    assert main(["lra", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_an_unknown_task_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["lra", "--task", "pathfinder"])
    assert exit_info.value.code == 2 and "pathfinder" in capsys.readouterr().err


def test_results_tables_put_each_run_beside_the_papers_value_for_its_kernel_and_encoding(tmp_path):
    from spe.lab.lra.report import results_tables

    def write(name, task, attention, positional, accs):
        results = [{"seed": i, "test_accuracy": a / 100, "best_step": 10, "seconds": 120.0} for i, a in enumerate(accs)]
        summary = {"config": {"task": task, "attention": attention, "positional": positional, "steps": 20},
                   "results": results, "test_accuracy": accs, "mean": sum(accs) / len(accs), "std": 1.0}
        # "std" 1.0 stands for whatever an older file stored (the population std): the table recomputes it
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(summary))

    write("a", "image", "performer", "convspe-2d", [30.0, 32.0])
    write("b", "listops", "linear-relu", "convspe", [20.0])
    write("c", "listops", "performer", "sinespe", [19.0])
    write("d", "listops", "performer", "none", [18.0])
    text = results_tables(tmp_path)
    rows = [line.split(" | ")[:2] for line in text.splitlines() if line.startswith("| performer") or
            line.startswith("| linear")]
    assert rows[:3] == [["| performer", "sinespe"], ["| performer", "none"], ["| linear-relu", "convspe"]]
    assert text.index("### ListOps") < text.index("### Image")  # the paper's task order
    # [30, 32]: sample std |30 − 32| / √2 = 1.414; one seed has no spread ("–"); the paper's column as printed
    cells = table_rows(text, "kernel", "encoding")
    columns = ("test accuracy (%)", "seeds", "per seed", "best step / steps", "minutes per run", "paper, Table 1")
    assert [cells["performer", "convspe-2d"][c] for c in columns] == [
        "**31.00 ± 1.41**", "2", "30.0, 32.0", "10, 10 / 20", "2.0", "40.06"]
    assert [cells["linear-relu", "convspe"][c] for c in columns] == [
        "**20.00 ± –**", "1", "20.0", "10 / 20", "2.0", "9.50 ± 1.17"]
    assert "mean ± sample std (n − 1) over seeds; – for one seed" in text.splitlines()[0]
    assert "Transformer 36.37" in text


@pytest.mark.parametrize("threads", [-1, True, 1.5])
def test_a_bad_thread_count_is_refused_before_anything_runs(threads, tmp_path):
    with pytest.raises(ValueError, match=rf"threads must be 0 .* got {threads!r}"):
        run_lra(preset_config("listops", "ape", "performer", preset="cpu-small"), [0], tmp_path / "out", threads=threads)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text,message", [("[1, 2]", "it holds a JSON array"), ("{broken", "not valid JSON")])
def test_an_out_whose_config_json_is_another_tools_is_refused_naming_it(text, message, tmp_path):
    from spe.lab.lra.run import open_experiment

    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match=rf"{tmp_path}/config\.json .*spe lra.*{message}"):
        open_experiment(tmp_path, preset_config("listops", "ape", "performer", preset="cpu-small"))
    assert (tmp_path / "config.json").read_text() == text

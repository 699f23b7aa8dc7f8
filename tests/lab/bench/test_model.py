"""Whole-model bench: rounds pooled into ratios to APE, the longest-length search, the worker's model."""

import json
import math

import pytest
import torch

from spe.lab.bench import model as model_bench
from spe.lab.bench import run
from spe.lab.bench.model import extrapolate_longest, longest_length, merge_rounds, parse_longest, parse_shapes
from spe.lab.bench.worker import measure_model
from spe.lab.cli.main import main

TINY = {"d_model": 16, "num_layers": 1, "num_heads": 2, "d_ff": 32, "num_realizations": 4, "num_sines": 2}


def _in_process(case, timeout):
    """run_case without a subprocess (peak memory then is not the case's own; fine for wiring)."""
    return {**case, **measure_model(case, torch.device("cpu"))}


def _tiny_bench(tmp_path, monkeypatch):
    """(config file of the TINY model, output folder), with model cases run in-process and the
    matmul rate faked (the real one takes seconds on a loaded machine)."""
    monkeypatch.setattr(model_bench, "run_case", _in_process)
    monkeypatch.setattr(run, "matmul_gflops", lambda: 100.0)
    config = tmp_path / "tiny.toml"
    config.write_text("[model]\n" + "".join(f"{k} = {v}\n" for k, v in TINY.items()))
    return config, tmp_path / "bench"


def test_parsers_accept_the_documented_forms_and_name_bad_input():
    assert parse_shapes("8x2048, 2x8192") == [(8, 2048), (2, 8192)]
    with pytest.raises(ValueError, match="got '8x'"):
        parse_shapes("8x")
    assert parse_longest("ape,sinespe:blocked,ape+softmax", "performer") == [
        ("ape", "-", "performer"), ("sinespe", "blocked", "performer"), ("ape", "-", "softmax")]
    with pytest.raises(ValueError, match="ape\\+flash"):
        parse_longest("ape+flash", "performer")
    with pytest.raises(ValueError, match="sinespe:magic"):
        parse_longest("sinespe:magic", "performer")


def test_merge_rounds_pools_every_step_and_divides_by_ape_of_the_same_shape():
    def rec(pos, batch, times, mb):
        return {"positional": pos, "impl": "-", "attention": "performer", "batch": batch, "length": 8,
                "median_ms": 0.0, "times_ms": times, "peak_mb": mb}

    raw = [rec("ape", 2, [10.0], 100), rec("sinespe", 2, [30.0], 120), rec("ape", 2, [20.0, 40.0], 90),
           rec("sinespe", 2, [36.0], 150), rec("ape", 1, [5.0], 50), rec("sinespe", 1, [10.0], 40)]
    merged = {(r["positional"], r["batch"]): r for r in merge_rounds(raw)}
    ape, spe = merged["ape", 2], merged["sinespe", 2]
    assert ape["median_ms"] == 20.0 and ape["rounds"] == 2  # median of 10, 20, 40 across both rounds
    assert spe["median_ms"] == 33.0 and spe["peak_mb"] == 150  # largest peak of the rounds
    assert spe["time_vs_ape"] == pytest.approx(33 / 20) and spe["memory_vs_ape"] == pytest.approx(150 / 100)
    assert merged["sinespe", 1]["time_vs_ape"] == 2.0  # APE of batch 1, not of batch 2
    assert ape["tokens_per_s"] == pytest.approx(2 * 8 / 0.020)


def _fake_measure(base, per_token, quadratic=0.0, seen=None):
    def measure(case):
        n = case["length"]
        if seen is not None:
            seen.append(n)
        return {**case, "median_ms": n / 100, "base_mb": base, "peak_mb": per_token * n + quadratic * n * n}
    return measure


def test_longest_length_extrapolates_a_linear_memory_growth_beyond_what_may_be_measured():
    seen = []
    r = longest_length({}, "ape", "-", "performer", budget_mb=16384, measure_limit_mb=2000, start=1024,
                       measure=_fake_measure(300, 0.25, seen=seen))
    # 300 + N/4 MB: 2,000 MB is passed at N = 6,800, so 1,024..4,096 are measured and 8,192 is not
    assert seen == [1024, 2048, 4096]
    assert r["extrapolated"] and r["longest"] == (16384 - 300) * 4
    assert r["fit"]["coefficients_mb"] == pytest.approx([300, 0.25])


def test_longest_length_fits_a_quadratic_for_softmax():
    r = longest_length({}, "ape", "-", "softmax", budget_mb=16384, measure_limit_mb=2000, start=256,
                       measure=_fake_measure(300, 0.1, quadratic=1e-4))
    # 300 + 0.1 N + 1e-4 N² = 16,384: the positive root of the quadratic (a line would say ~5,000)
    root = (-0.1 + math.sqrt(0.1**2 + 4e-4 * (16384 - 300))) / 2e-4
    assert r["extrapolated"] and r["longest"] == int(root)


def test_a_softmax_fit_without_a_positive_square_term_falls_back_to_a_line():
    # memory per token falling with N (a kernel that never forms the scores): no real root of a
    # concave quadratic would say "unbounded" or nothing; the line through the last doubling does
    points = [(4096, 676.0, 1.0), (8192, 1130.0, 1.0), (16384, 1889.0, 1.0)]
    longest, fit = extrapolate_longest(points, "softmax", 16384)
    slope = (1889 - 1130) / 8192
    assert fit["points"] == [8192, 16384] and longest == int((16384 - (1130 - slope * 8192)) / slope)


def test_longest_length_bisects_when_the_budget_is_measurable():
    seen = []
    r = longest_length({}, "ape", "-", "performer", budget_mb=1300, measure_limit_mb=10**6, start=1024,
                       measure=_fake_measure(300, 0.25, seen=seen))
    # fits at 4,000 tokens exactly: 4,096 is over, bisection between 2,048 and 4,096 to 1/16 of 2,048
    assert not r["extrapolated"] and seen[:3] == [1024, 2048, 4096]
    assert 4000 - 2048 // 16 <= r["longest"] <= 4000


@pytest.mark.slow
def test_model_worker_sets_the_impl_and_the_training_window():
    case = {"model": TINY, "vocab_size": 11, "positional": "sinespe", "impl": "blocked", "attention": "performer",
            "batch": 1, "length": 12, "repeats": 1, "max_seconds": 5}
    rec = measure_model(case, torch.device("cpu"))
    assert rec["attention_window"] == 12  # what `spe train --seq-len 12` gives sineSPE
    assert "resolved_impl" not in rec and rec["median_ms"] > 0 and len(rec["times_ms"]) == 1
    auto = measure_model({**case, "impl": "-", "positional": "sinespe"}, torch.device("cpu"))
    assert auto["resolved_impl"] == "materialized"  # a tiny code
    # a learned clock's per-sequence codes take their one path, whatever the index choice would be
    learned = measure_model({**case, "impl": "-", "model": {**TINY, "spe_time": "learned"}}, torch.device("cpu"))
    assert learned["resolved_impl"] == "timed"
    assert measure_model({**case, "positional": "ape"}, torch.device("cpu"))["attention_window"] is None


@pytest.mark.slow
def test_cli_model_mode_and_longest_write_tables_and_strict_json(tmp_path, monkeypatch):
    monkeypatch.setattr(model_bench, "run_case", _in_process)
    monkeypatch.setattr(run, "matmul_gflops", lambda: 100.0)  # the real one takes seconds on a loaded machine
    config = tmp_path / "tiny.toml"
    config.write_text("[model]\n" + "".join(f"{k} = {v}\n" for k, v in TINY.items()))
    out = tmp_path / "bench"
    assert main(["bench", "--modes", "model", "--model-shapes", "2x8", "--positionals", "ape,sinespe:fused",
                 "--rounds", "2", "--repeats", "1", "--config", str(config), "--longest", "ape+softmax",
                 "--longest-start", "8", "--measure-limit-mb", "1", "--out", str(out), "--no-progress"]) == 0
    text = (out / "bench.json").read_text()
    assert "NaN" not in text
    data = json.loads(text)
    assert [r["round"] for r in data["model_rounds"]] == [0, 0, 1, 1]  # cycled, not one series then the other
    assert {(r["positional"], r["impl"], r["rounds"]) for r in data["model"]} == {("ape", "-", 2), ("sinespe", "fused", 2)}
    assert data["longest"][0]["attention"] == "softmax" and data["longest"][0]["extrapolated"]
    table = (out / "bench.md").read_text()
    assert "| sinespe (fused) + performer |" in table and "Batch 2, N = 8:" in table
    assert "| ape + softmax |" in table and "extrapolated" in table
    assert data["matmul_gflops"] == 100.0


@pytest.mark.slow
def test_one_run_can_measure_layer_pairs_and_other_model_encodings(tmp_path, monkeypatch):
    config, out = _tiny_bench(tmp_path, monkeypatch)
    assert main(["bench", "--modes", "train,model", "--lengths", "16", "--pairs", "ape+linear",
                 "--model-positionals", "ape,sinespe:blocked", "--model-shapes", "2x8", "--rounds", "1",
                 "--repeats", "1", "--config", str(config), "--out", str(out), "--threads", "1",
                 "--no-progress"]) == 0
    data = json.loads((out / "bench.json").read_text())
    assert [(r["mode"], r["positional"], r["attention"]) for r in data["records"]] == [("train", "ape", "linear")]
    assert [(r["positional"], r["impl"]) for r in data["model"]] == [("ape", "-"), ("sinespe", "blocked")]


def _layer_in_process(case, timeout):
    """run.run_case for layer modes without a subprocess (wiring only, like _in_process)."""
    from spe.lab.bench.worker import _decay, measure_generate, measure_train

    measure = {"train": measure_train, "generate": measure_generate}[case["mode"]]
    return {**case, **measure(case, torch.device("cpu")), "decay": _decay(case)}


@pytest.mark.slow
def test_decay_modes_are_measured_side_by_side_in_one_run(tmp_path, monkeypatch):
    """``--decay none,fixed``: every linear-kernel case twice (softmax once), each record built with
    its own decay, decay rows divided by APE without decay, and labelled apart in the tables."""
    config, out = _tiny_bench(tmp_path, monkeypatch)
    monkeypatch.setattr(run, "run_case", _layer_in_process)
    assert main(["bench", "--modes", "generate,model", "--lengths", "16,32", "--positionals", "ape,rope",
                 "--attentions", "performer,softmax", "--decay", "none,fixed", "--model-shapes", "2x8",
                 "--rounds", "1", "--repeats", "1", "--batch-size", "1", "--config", str(config),
                 "--out", str(out), "--threads", "1", "--no-progress"]) == 0
    data = json.loads((out / "bench.json").read_text())
    layer = sorted((r["positional"], r["attention"], r["decay"]) for r in data["records"] if r["length"] == 16)
    assert layer == [("ape", "performer", "fixed"), ("ape", "performer", "none"), ("ape", "softmax", "none"),
                     ("rope", "performer", "fixed"), ("rope", "performer", "none"), ("rope", "softmax", "none")]
    model = {(r["positional"], r["attention"], r["decay"]): r for r in data["model"]}
    assert set(model) == {(p, "performer", d) for p in ("ape", "rope") for d in ("none", "fixed")} | {
        ("ape", "softmax", "none"), ("rope", "softmax", "none")}
    base = model["ape", "performer", "none"]
    for key, r in model.items():  # performer rows against APE + performer without decay
        if key[1] == "performer":
            assert r["time_vs_ape"] == pytest.approx(r["median_ms"] / base["median_ms"])
    table = (out / "bench.md").read_text()
    assert "| rope + performer + decay fixed |" in table and "| rope + performer |" in table
    assert "| ape + softmax + decay" not in table
    exponents = data["summary"]["exponents"]
    assert "generate rope - performer decay-fixed" in exponents and "generate rope - performer" in exponents
    assert main(["bench", "--decay", "none,exponential", "--out", str(out)]) == 2


@pytest.mark.slow
def test_the_bench_layer_and_model_are_built_with_the_case_decay():
    from spe.lab.bench.worker import build

    case = {"num_heads": 2, "head_dim": 4, "positional": "rope", "attention": "performer", "impl": "-",
            "num_realizations": 4, "num_sines": 2, "kernel_size": 4, "num_features": 8, "chunk_size": 4,
            "length": 8, "decay": "fixed"}
    assert build(case)[0].decay == "fixed"
    assert build({**case, "decay": "none"})[0].decay == "none"
    assert build({**case, "attention": "softmax"})[0].decay == "none"  # softmax takes none
    rec = measure_model({"model": {**TINY, "decay": "none"}, "vocab_size": 11, "positional": "rope",
                         "impl": "-", "attention": "performer", "batch": 1, "length": 8, "repeats": 1,
                         "max_seconds": 5, "decay": "learned"}, torch.device("cpu"))
    assert rec["decay"] == "learned"  # the case's mode wins over the model options'


def test_decoding_steps_are_timed_at_least_fifty_times(monkeypatch):
    """A decoding step costs about a millisecond: its median needs many steps, train cases keep --repeats."""
    monkeypatch.setattr(run, "run_case", _layer_in_process)
    monkeypatch.setattr(run, "matmul_gflops", lambda: 100.0)
    result = run.run_bench(lengths=[16], modes=["train", "generate"], pairs=[("ape", "-", "performer")], batch=1,
                           num_heads=2, head_dim=4, num_features=8, chunk_size=4, repeats=2, progress=False)
    timed = {r["mode"]: len(r["times_ms"]) for r in result["records"]}
    assert timed == {"train": 2, "generate": run.GENERATE_MIN_REPEATS}


@pytest.mark.slow
def test_fox_is_measured_with_its_gate_and_one_length_makes_no_exponent(tmp_path, monkeypatch):
    """``--decay gated`` on softmax is FoX: measured with the gate (training and a KV-cache step
    carrying the keys' summed log gates), labelled apart from softmax; one length gives no
    scaling exponent (no division by log 1)."""
    config, out = _tiny_bench(tmp_path, monkeypatch)
    monkeypatch.setattr(run, "run_case", _layer_in_process)
    assert main(["bench", "--modes", "train,generate", "--lengths", "16", "--pairs", "none+softmax,ape+performer",
                 "--decay", "none,gated", "--repeats", "1", "--batch-size", "1", "--config", str(config),
                 "--out", str(out), "--threads", "1", "--no-progress"]) == 0
    data = json.loads((out / "bench.json").read_text())
    fox = [r for r in data["records"] if r["attention"] == "softmax" and r["decay"] == "gated"]
    assert sorted(r["mode"] for r in fox) == ["generate", "train"] and all(r["median_ms"] > 0 for r in fox)
    assert "none + softmax + decay gated" in (out / "bench.md").read_text()


@pytest.mark.parametrize("positional,attention", [("ape", "performer"), ("ape", "softmax"), ("sinespe", "performer"),
                                                  ("convspe", "performer"), ("rope", "performer"),
                                                  ("none", "linear-elu")])
def test_every_module_of_a_bench_case_is_on_the_case_device(positional, attention):
    """The layer, the SPE code generator and the token encoding all move (on CUDA the sinusoidal
    APE's frequency buffer was left on the CPU and every APE case failed)."""
    from spe.lab.bench.worker import build

    case = {"num_heads": 2, "head_dim": 4, "positional": positional, "attention": attention, "impl": "-",
            "num_realizations": 4, "num_sines": 2, "kernel_size": 4, "num_features": 8, "chunk_size": 4,
            "length": 8, "decay": "none"}
    modules = [m for m in build(case, torch.device("meta")) if m is not None]
    assert len(modules) >= 2 - (positional in ("rope", "none"))
    for module in modules:
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            assert t.device.type == "meta", f"{positional}: {type(module).__name__}.{name} on {t.device}"


@pytest.mark.parametrize("mode", ["train", "generate", "model"])
def test_bench_precision_runs_the_timed_work_under_autocast(mode, monkeypatch):
    """``--precision bf16``: every projection of the layer (or the whole model) runs inside bf16
    autocast; fp32 outside any."""
    import spe.lab.bench.worker as worker

    seen = []
    forward = torch.nn.Linear.forward

    def recorded(self, x):
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"))
        return forward(self, x)

    monkeypatch.setattr(torch.nn.Linear, "forward", recorded)
    case = {"num_heads": 2, "head_dim": 4, "positional": "sinespe", "attention": "performer", "impl": "-",
            "num_realizations": 4, "num_sines": 2, "kernel_size": 4, "num_features": 8, "chunk_size": 4,
            "length": 8, "decay": "none", "batch": 1, "repeats": 1, "model": TINY, "vocab_size": 11}
    measure = {"train": worker.measure_train, "generate": worker.measure_generate, "model": measure_model}[mode]
    for precision, want in (("bf16", torch.bfloat16), ("fp32", False)):
        seen.clear()
        measure({**case, "precision": precision}, torch.device("cpu"))
        assert seen and set(seen) == {want}, (precision, set(seen))


def test_bench_refuses_fp16_on_the_cpu_before_measuring(tmp_path, capsys):
    assert main(["bench", "--precision", "fp16", "--out", str(tmp_path / "b")]) == 2
    assert "precision fp16 needs a CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_bench_precision_is_recorded_and_named_in_the_report(tmp_path, monkeypatch):
    config, out = _tiny_bench(tmp_path, monkeypatch)
    assert main(["bench", "--modes", "model", "--model-shapes", "2x8", "--positionals", "ape", "--rounds", "1",
                 "--repeats", "1", "--config", str(config), "--precision", "bf16", "--out", str(out),
                 "--no-progress"]) == 0
    data = json.loads((out / "bench.json").read_text())
    assert data["precision"] == "bf16" and data["model_rounds"][0]["precision"] == "bf16"
    assert (out / "bench.md").read_text().startswith("Precision: bf16 autocast")

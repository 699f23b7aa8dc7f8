"""`spe bench` writes one record per measurement with the documented fields, a table and plots."""

import pytest
import json

from spe.lab.bench.run import layer_flops
from spe.lab.cli.main import main


@pytest.mark.slow
def test_bench_writes_records_table_and_plots(tmp_path):
    out = tmp_path / "bench"
    assert main(["bench", "--lengths", "32,64", "--positionals", "ape,sinespe:fused", "--attentions",
                 "performer,linear", "--repeats", "2", "--json", str(out / "b.json"), "--out", str(out),
                 "--threads", "1", "--no-progress"]) == 0
    data = json.loads((out / "b.json").read_text())
    records = data["records"]
    assert len(records) == 2 * 2 * 2 * 2  # modes × positionals × attentions × lengths
    for r in records:
        assert {"positional", "attention", "length", "mode", "impl", "median_ms", "peak_mb"} <= r.keys()
        assert r["median_ms"] > 0 and r["load_1min"] >= 0  # how busy the cores were when it started
        if r["mode"] == "generate":
            assert r["per_token_ms"] == r["median_ms"]
    assert data["matmul_gflops"] > 0
    assert data["command"].startswith("spe bench --lengths 32,64 ")
    assert "| sinespe (fused) + performer |" in (out / "bench.md").read_text()
    assert (out / "bench_time.png").stat().st_size > 0 and (out / "bench_generate.png").stat().st_size > 0


def test_layer_flops_grow_linearly_for_linear_kernels_and_quadratically_for_softmax():
    case = dict(batch=1, length=1000, num_heads=2, head_dim=8, num_realizations=4, num_sines=2,
                num_features=8, chunk_size=16, positional="sinespe", attention="performer")
    assert layer_flops({**case, "length": 2000}) == 2 * layer_flops(case)
    soft = {**case, "attention": "softmax"}
    assert layer_flops({**soft, "length": 2000}) > 3.5 * layer_flops(soft)


def test_positional_names_select_implementations_and_aliases():
    import pytest

    from spe.lab.bench.run import SERIES, parse_series, series_name

    assert parse_series("sinespe,sinespe:reference,sinespe:blocked") == [
        ("sinespe", "-"), ("sinespe", "reference"), ("sinespe", "blocked")]
    assert parse_series("sinespe:auto,convspe:fft,convspe,convspe:direct") == [
        ("sinespe", "-"), ("convspe", "fft"), ("convspe", "direct")]
    assert parse_series(None) == SERIES
    # Every series round-trips through its name (the CLI's --positionals vocabulary).
    assert [parse_series(series_name(*s))[0] for s in SERIES] == SERIES
    with pytest.raises(ValueError, match=r"sinespe:fused.*got .sinespe:magic"):
        parse_series("sinespe:magic")


@pytest.mark.slow
def test_bench_measures_each_spe_implementation_and_records_the_automatic_choice(tmp_path):
    out = tmp_path / "bench"
    assert main(["bench", "--lengths", "24", "--modes", "train,generate", "--attentions", "performer",
                 "--positionals", "sinespe,sinespe:blocked,convspe:direct", "--repeats", "1",
                 "--json", str(out / "b.json"), "--out", str(out), "--threads", "1", "--no-progress"]) == 0
    records = json.loads((out / "b.json").read_text())["records"]
    got = {(r["mode"], r["positional"], r["impl"]) for r in records}
    assert got == {(m, p, i) for m in ("train", "generate")
                   for p, i in [("sinespe", "-"), ("sinespe", "blocked"), ("convspe", "direct")]}
    auto = [r for r in records if r["impl"] == "-"]
    assert {r["resolved_impl"] for r in auto} == {"materialized"}  # 24·8·64·64 elements: small code
    assert all("resolved_impl" not in r for r in records if r["impl"] != "-")
    table = (out / "bench.md").read_text()
    assert "| sinespe (auto) + performer |" in table and "| sinespe (blocked) + performer |" in table
    assert "| convspe (direct) + performer |" in table


@pytest.mark.slow
def test_pairs_measure_exactly_the_named_cases_and_reject_unknown_ones(tmp_path):
    import pytest

    from spe.lab.bench.run import parse_pairs

    assert parse_pairs("ape+softmax,sinespe:blocked+performer,ape+softmax") == [
        ("ape", "-", "softmax"), ("sinespe", "blocked", "performer")]
    with pytest.raises(ValueError, match="SERIES\\+ATTENTION"):
        parse_pairs("ape+favor")
    with pytest.raises(ValueError, match="sinespe:magic"):
        parse_pairs("sinespe:magic+performer")
    out = tmp_path / "bench"
    assert main(["bench", "--lengths", "24", "--modes", "train,generate", "--pairs",
                 "ape+softmax,sinespe:reference+performer", "--repeats", "1", "--out", str(out),
                 "--threads", "1", "--no-progress"]) == 0
    records = json.loads((out / "bench.json").read_text())["records"]
    # The reference twin has no generation step, so it is measured in train mode only.
    assert sorted((r["mode"], r["positional"], r["impl"], r["attention"]) for r in records) == [
        ("generate", "ape", "-", "softmax"), ("train", "ape", "-", "softmax"),
        ("train", "sinespe", "reference", "performer")]
    assert main(["bench", "--pairs", "ape+favor", "--out", str(out)]) == 2


@pytest.mark.slow
def test_prefill_mode_times_a_prompt_in_one_pass_beside_its_token_by_token_cost(tmp_path):
    out = tmp_path / "bench"
    assert main(["bench", "--lengths", "32", "--pairs", "ape+softmax,sinespe+performer", "--modes", "generate,prefill",
                 "--repeats", "2", "--json", str(out / "b.json"), "--out", str(out), "--threads", "1",
                 "--no-progress"]) == 0
    records = json.loads((out / "b.json").read_text())["records"]
    prefill = [r for r in records if r["mode"] == "prefill"]
    assert len(prefill) == 2 and all("median_ms" in r for r in prefill)
    for r in prefill:
        assert r["per_token_ms"] == r["median_ms"] / r["length"]
    md = (out / "bench.md").read_text()
    assert "### prefill: a prompt of N positions in one pass" in md
    step = next(r for r in records if r["mode"] == "generate" and r["positional"] == "ape"
                and r["attention"] == "softmax" and r["length"] == 32)
    assert f"ape + softmax, N=32: token by token ≈ 32 × {step['median_ms']:.2f} ms" in md

"""`spe bench` writes one record per measurement with the documented fields, a table and plots."""

import json

from spe.bench.run import layer_flops
from spe.cli.main import main


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
        assert r["median_ms"] > 0
        if r["mode"] == "generate":
            assert r["per_token_ms"] == r["median_ms"]
    assert data["matmul_gflops"] > 0
    assert "| sinespe (fused) + performer |" in (out / "bench.md").read_text()
    assert (out / "bench_time.png").stat().st_size > 0 and (out / "bench_generate.png").stat().st_size > 0


def test_layer_flops_grow_linearly_for_linear_kernels_and_quadratically_for_softmax():
    case = dict(batch=1, length=1000, num_heads=2, head_dim=8, num_realizations=4, num_sines=2,
                num_features=8, chunk_size=16, positional="sinespe", attention="performer")
    assert layer_flops({**case, "length": 2000}) == 2 * layer_flops(case)
    soft = {**case, "attention": "softmax"}
    assert layer_flops({**soft, "length": 2000}) > 3.5 * layer_flops(soft)

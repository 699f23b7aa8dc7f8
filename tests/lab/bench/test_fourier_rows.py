"""``spe bench --attentions fnet,fnet-causal``: the Fourier mixers' rows (FNet in train mode, its
causal twin in train, generate and prefill; with encodings on tokens only), at tiny sizes."""

import pytest
import torch

from spe.lab.bench import run
from spe.lab.cli.main import main


def _in_process(case, timeout):
    """run.run_case without a subprocess (wiring only: peak memory is not the case's own)."""
    from spe.lab.bench.worker import measure_case

    return {**case, **measure_case(case, torch.device("cpu"))}


def test_mixers_are_planned_on_tokens_only_and_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "run_case", _in_process)
    monkeypatch.setattr(run, "matmul_gflops", lambda: 100.0)
    result = run.run_bench(lengths=[16, 32], modes=["train", "generate", "prefill"],
                           series=[("ape", "-"), ("none", "-"), ("sinespe", "-"), ("rope", "-")],
                           attentions=["fnet", "fnet-causal"], decay=["none", "fixed"], batch=1, num_heads=2,
                           head_dim=8, repeats=1, progress=False)
    got = sorted({(r["mode"], r["positional"], r["attention"]) for r in result["records"]})
    assert got == sorted([("train", p, "fnet") for p in ("ape", "none")]
                         + [(m, p, "fnet-causal") for m in ("train", "generate", "prefill") for p in ("ape", "none")])
    assert all(r["median_ms"] > 0 and r["decay"] == "none" for r in result["records"])
    out = tmp_path / "bench"
    run.write_outputs(result, out / "bench.json", out)
    table = (out / "bench.md").read_text()
    assert "| ape + fnet |" in table and "| none + fnet-causal |" in table


def test_mixer_flops_grow_as_l_log_l():
    case = {"batch": 1, "num_heads": 4, "head_dim": 16, "num_realizations": 8, "num_sines": 2, "num_features": 8,
            "chunk_size": 8, "positional": "ape"}
    for attention in ("fnet", "fnet-causal"):
        small, large = (run.layer_flops({**case, "attention": attention, "length": n}) for n in (1024, 4096))
        assert 4 < large / small < 6  # 4 × (log 4096 / log 1024), not 16


def test_the_cli_takes_the_mixers_and_refuses_a_misspelt_one(tmp_path, capsys):
    assert main(["bench", "--lengths", "16", "--attentions", "fnet,fourier", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "fourier" in err and "fnet-causal" in err

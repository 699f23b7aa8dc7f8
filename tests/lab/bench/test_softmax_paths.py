"""``spe bench --softmax-impl``: softmax's paths (FlexAttention, the per-block form) measured side by
side, each record naming its path and any fallback, labelled apart in the tables."""

import json

import pytest
import torch

from spe.lab.bench import run
from spe.lab.cli.main import main


def _in_process(case, timeout):
    """run.run_case without a subprocess (wiring only: peak memory is not the case's own)."""
    from spe.lab.bench.worker import _decay, measure_generate, measure_recording_fallbacks, measure_train

    measure = {"train": measure_train, "generate": measure_generate}[case["mode"]]
    return {**case, **measure_recording_fallbacks(measure, case, torch.device("cpu")), "decay": _decay(case)}


def test_parse_softmax_impls_takes_the_paths_and_names_bad_input():
    assert run.parse_softmax_impls(None) == ["auto"]
    assert run.parse_softmax_impls("blocks, flex,blocks") == ["blocks", "flex"]
    with pytest.raises(ValueError, match="--softmax-impl takes a comma-separated subset of auto, flex, blocks"):
        run.parse_softmax_impls("flex,triton")


def test_softmax_cases_are_measured_once_per_path_and_labelled_apart(tmp_path, monkeypatch):
    """FoX (none + softmax, decay gated) and ALiBi per path; a score encoding that refuses the gate
    is not planned with it; performer once; on the CPU the forced flex falls back (its backward
    needs CUDA) and the record and the row say so."""
    monkeypatch.setattr(run, "run_case", _in_process)
    monkeypatch.setattr(run, "matmul_gflops", lambda: 100.0)
    result = run.run_bench(lengths=[16], modes=["train"], pairs=[("none", "-", "softmax"), ("alibi", "-", "softmax"),
                                                                 ("ape", "-", "performer")],
                           decay=["none", "gated"], softmax_impls=["blocks", "flex"], batch=1, num_heads=2,
                           head_dim=16, num_features=8, chunk_size=4, repeats=1, progress=False)
    got = sorted((r["positional"], r["attention"], r["decay"], r.get("softmax_impl", "auto"))
                 for r in result["records"])
    assert got == [("alibi", "softmax", "none", "blocks"), ("alibi", "softmax", "none", "flex"),
                   ("ape", "performer", "gated", "auto"), ("ape", "performer", "none", "auto"),
                   ("none", "softmax", "gated", "blocks"), ("none", "softmax", "gated", "flex"),
                   ("none", "softmax", "none", "blocks"), ("none", "softmax", "none", "flex")]
    for r in result["records"]:
        assert r["median_ms"] > 0
        fell_back = r.get("softmax_impl") == "flex"
        assert ("backward does not run on the CPU" in r.get("softmax_fallback", "")) == fell_back
    out = tmp_path / "bench"
    run.write_outputs(result, out / "bench.json", out)
    table = (out / "bench.md").read_text()
    assert "| none + softmax [flex, fell back] + decay gated |" in table
    assert "| none + softmax [blocks] + decay gated |" in table and "| alibi + softmax [blocks] |" in table


def test_the_cli_refuses_an_unknown_softmax_path_before_measuring(tmp_path, capsys):
    assert main(["bench", "--softmax-impl", "fast", "--out", str(tmp_path / "b")]) == 2
    assert "--softmax-impl takes" in capsys.readouterr().err

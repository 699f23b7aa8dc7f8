"""``spe bench --attention-blocks``: block-local softmax measured beside full attention at tiny sizes
(wiring only, no timing claims): the softmax cases that take it run once per block length, each
record and row naming it; FoX, PaTH and linear kernels run full only."""

import pytest
import torch

from spe.lab.bench import run
from spe.lab.bench.worker import measure_case
from spe.lab.cli.main import main


def _measured_here(case, timeout):
    """run.run_case in this process (peak memory is then not the case's own)."""
    return {**case, **measure_case(case, torch.device("cpu"))}


def test_parse_blocks_takes_lengths_and_names_bad_input():
    assert run.parse_blocks(None) == [0]
    assert run.parse_blocks("0, 64,64") == [0, 64]
    for text in ("-4", "x", ","):
        with pytest.raises(ValueError, match="--attention-blocks takes"):
            run.parse_blocks(text)


def test_softmax_cases_run_full_and_in_blocks_and_are_labelled_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "run_case", _measured_here)
    monkeypatch.setattr(run, "matmul_gflops", lambda: 100.0)
    monkeypatch.setattr(run, "GENERATE_MIN_REPEATS", 1)
    result = run.run_bench(lengths=[8, 12], modes=["train", "generate"],
                           pairs=[("music-relative", "-", "softmax"), ("none", "-", "softmax")],
                           decay=["none", "gated"], attention_blocks=[0, 4], batch=1, num_heads=2, head_dim=8,
                           num_features=8, chunk_size=4, repeats=1, progress=False)
    runs = {(r["mode"], r["positional"], r["attention"], r["decay"], r.get("attention_blocks", 0))
            for r in result["records"]}
    for mode in ("train", "generate"):
        assert (mode, "music-relative", "softmax", "none", 4) in runs and (mode, "none", "softmax", "none", 4) in runs
    assert all(blocks == 0 for *_, dec, blocks in runs if dec != "none")  # FoX: full attention only
    assert not run._takes_blocks("path", "softmax", "none") and not run._takes_blocks("ape", "performer", "none")
    assert all("median_ms" in r for r in result["records"]), [r.get("skipped") for r in result["records"]]
    out = tmp_path / "bench"
    run.write_outputs(result, out / "bench.json", out)
    table = (out / "bench.md").read_text()
    assert "| music-relative + softmax blocks 4 |" in table and "| music-relative + softmax |" in table
    assert "softmax-blocks-4" in " ".join(run.summarize_bench(result)["exponents"])


def test_a_block_record_is_no_baseline_for_ratios():
    from spe.lab.bench.targets import find_record

    full = {"mode": "train", "positional": "none", "impl": "-", "attention": "softmax", "length": 8, "median_ms": 2.0}
    blocks = {**full, "attention_blocks": 4, "median_ms": 1.0}
    assert find_record([blocks, full], "train", "none", "-", "softmax", 8) is full


def test_the_cli_refuses_bad_blocks_before_measuring(tmp_path, capsys):
    assert main(["bench", "--attention-blocks", "-8", "--out", str(tmp_path / "b")]) == 2
    assert "--attention-blocks takes" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_sine_s_automatic_choice_is_said_once_per_length_with_blocks():
    row = {"mode": "train", "positional": "sinespe", "impl": "-", "attention": "softmax", "length": 8,
           "median_ms": 1.0, "peak_mb": 1.0, "resolved_impl": "materialized"}
    lines = run._auto_choices([row, {**row, "attention_blocks": 4}])
    assert lines[-1] == "auto chose: sinespe + softmax N=8: materialized"

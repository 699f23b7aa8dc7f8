"""``spe bench --fox-path-impl``: FoX's, PaTH's and PaTH-FoX's flash form beside the form that keeps the
L × L terms, in one run, each row named by the form that ran, a form forced on either side of its
length threshold."""

from collections import Counter

import pytest
import torch

import spe.ops.path.chunk as path_chunk
import spe.ops.softmax.chunk as softmax_chunk
from spe.lab.bench import forms, run, worker
from spe.lab.cli.main import main
from spe.ops.path.flash import _FlashPath
from spe.ops.softmax.flash import _FlashFox


def test_parse_fox_path_impls_takes_the_forms_and_names_bad_input():
    assert forms.parse_fox_path_impls(None) is None
    assert forms.parse_fox_path_impls("chunk, flash,chunk") == ["chunk", "flash"]
    with pytest.raises(ValueError, match="--fox-path-impl .*auto, chunk, flash, got 'flash,fast'"):
        forms.parse_fox_path_impls("flash,fast")


def test_each_fox_and_path_case_runs_once_per_form_and_the_forced_form_is_the_one_run(tmp_path, monkeypatch):
    """Thresholds of 8 positions: at N = 4 auto takes the chunk form and at 16 the flash form, so a
    forced flash at 4 and a forced chunk at 16 each go against auto's choice. The flash kernels'
    autograd functions are counted independently of the bench's own record of what ran."""
    monkeypatch.setattr(softmax_chunk, "FLASH_FOX_MIN_LENGTH", 8)
    monkeypatch.setattr(path_chunk, "FLASH_MIN_LENGTH", 8)
    flash_calls = Counter()
    for fn in (_FlashFox, _FlashPath):
        monkeypatch.setattr(fn, "apply", (lambda apply: lambda *a: flash_calls.update(["flash"]) or apply(*a))(fn.apply))

    def in_process(case, timeout):
        flash_calls.clear()
        record = {**case, **worker.measure_case(case, torch.device("cpu")), "decay": worker._decay(case)}
        return {**record, "flash_kernel_calls": flash_calls["flash"]}

    monkeypatch.setattr(run, "run_case", in_process)
    monkeypatch.setattr(run, "matmul_gflops", lambda: 100.0)
    torch.manual_seed(0)
    result = run.run_bench(lengths=[4, 16], modes=["train"], pairs=[("none", "-", "softmax"), ("path", "-", "softmax"),
                                                                    ("ape", "-", "performer")],
                           decay=["none", "gated"], fox_path_impls=["auto", "chunk", "flash"], batch=1, num_heads=2,
                           head_dim=16, num_features=8, chunk_size=4, repeats=1, progress=False)
    formed = {(r["positional"], r["attention"], r["decay"], r.get("fox_path_impl"), r["length"]): r
              for r in result["records"]}
    cases = [("none", "gated"), ("path", "none"), ("path", "gated")]  # FoX, PaTH, PaTH-FoX
    assert sorted(formed) == sorted(
        [(pos, "softmax", dec, form, n) for pos, dec in cases for form in ("auto", "chunk", "flash") for n in (4, 16)]
        + [("none", "softmax", "none", None, n) for n in (4, 16)]
        + [("ape", "performer", dec, None, n) for dec in ("none", "gated") for n in (4, 16)])
    for (pos, att, dec, form, n), r in formed.items():
        if form is None:
            assert "fox_path_ran" not in r and r["flash_kernel_calls"] == 0
            continue
        ran = form if form != "auto" else ("flash" if n >= 8 else "chunk")
        assert r["fox_path_ran"] == ran, (pos, dec, form, n)
        assert (r["flash_kernel_calls"] > 0) == (ran == "flash"), (pos, dec, form, n)
    assert (softmax_chunk.FLASH_FOX_MIN_LENGTH, path_chunk.FLASH_MIN_LENGTH) == (8, 8)  # restored after each case

    out = tmp_path / "bench"
    run.write_outputs(result, out / "bench.json", out)
    table = (out / "bench.md").read_text()
    for row in ("none + softmax [chunk] + decay gated", "none + softmax [flash] + decay gated",
                "path + softmax [chunk]", "path + softmax [flash]", "path + softmax [auto] + decay gated",
                "none + softmax", "ape + performer + decay gated"):
        assert f"\n| {row} | " in table, row
    assert "path + softmax [auto] + decay gated N=4: chunk form" in table
    assert "path + softmax [auto] + decay gated N=16: flash form" in table
    flash_row = next(line for line in table.splitlines() if line.startswith("| path + softmax [flash] | 16 | flash |"))
    assert flash_row.count("×") == 4  # over softmax (time, memory) and over the chunk form (time, memory)


def test_a_form_that_did_not_run_as_asked_is_named_in_the_row():
    record = {"positional": "path", "impl": "-", "attention": "softmax", "decay": "none", "fox_path_impl": "chunk",
              "fox_path_ran": "flash"}
    assert run._label(record) == "path + softmax [chunk, ran flash]"
    assert run._label({**record, "fox_path_ran": "chunk"}) == "path + softmax [chunk]"


def test_the_cli_refuses_an_unknown_form_before_measuring(tmp_path, capsys):
    assert main(["bench", "--fox-path-impl", "chunk,fast", "--out", str(tmp_path / "b")]) == 2
    assert "--fox-path-impl takes" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_the_chunk_forms_memory_is_predicted_quadratic_in_the_length():
    """A chunk-form case measured at 2,048 (1,000 MB) is predicted at 16× that at 8,192; the flash
    form at 4×, as every other layer."""
    prev = {"length": 2048, "median_ms": 10.0, "peak_mb": 1000.0, "repeats": 1, "fox_path_ran": "chunk"}
    assert run._predicted_too_big(prev, 8192, "softmax", "train", 30.0, 12000) == "skipped: predicted 16000 MB"
    assert run._predicted_too_big({**prev, "fox_path_ran": "flash"}, 8192, "softmax", "train", 30.0, 12000) is None

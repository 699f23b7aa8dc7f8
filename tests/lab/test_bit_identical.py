"""40-step runs of ``spe train``, ``spe lra`` and ``spe synth`` give the weights and losses recorded in
tests/data/bit_identical.json: a change of the lab's layout (runners, loaders, CLI) that changes what a run
computes turns this red.

Exact (the SHA-256 of every weight and the last logged losses to the bit) where this machine is the
recording one (same torch, CPU model and instruction sets, one thread): CPU kernels pick their code path,
hence their summation order, by instruction set, so on another machine the same code gives other bits.
There the losses are compared to 1e-3 relative, a smoke check only; the note says which ran.

Record again, after a change that is meant to change what runs compute:
``SPE_RECORD_BIT_IDENTICAL=1 python -m pytest tests/lab/test_bit_identical.py``.
"""

import hashlib
import json
import math
import os
import platform
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spe.lab.cli.main import main
from tiny_run import tiny_config, toml_text

RECORD = Path(__file__).resolve().parents[1] / "data" / "bit_identical.json"
RECORDING = os.environ.get("SPE_RECORD_BIT_IDENTICAL") == "1"
TINY_MODEL = ["--model-option", "d_model=32", "--model-option", "num_layers=1", "--model-option", "d_ff=64",
              "--model-option", "num_heads=2"]


def _machine() -> dict:
    flags = ""
    with open("/proc/cpuinfo") if Path("/proc/cpuinfo").is_file() else open(os.devnull) as info:
        for line in info:
            if line.startswith(("model name", "flags")):
                flags += line
            if line.startswith("flags"):
                break
    return {"torch": torch.__version__, "machine": platform.machine(),
            "cpu": hashlib.sha256(flags.encode()).hexdigest()[:16]}


def _weights_sha256(file: Path) -> str:
    digest = hashlib.sha256()
    for key, tensor in sorted(load_file(file).items()):
        digest.update(key.encode())
        digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _last_losses(metrics: Path) -> dict:
    """The last logged value of every loss and accuracy in a metrics.jsonl."""
    found = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        found.update({k: v for k, v in row.items() if "loss" in k or "accuracy" in k})
    return found


def _train(tmp_path: Path) -> tuple[Path, Path]:
    cfg = tiny_config(tmp_path, "train", steps=40)
    (tmp_path / "train.toml").write_text(toml_text(cfg))
    assert main(["-q", "train", "--config", str(tmp_path / "train.toml"), "--no-progress"]) == 0
    return tmp_path / "train" / "model.safetensors", tmp_path / "train" / "metrics.jsonl"


def _lra(tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "lra"
    assert main(["-q", "lra", "--task", "listops", "--steps", "40", "--batch-size", "4", "--seq-len", "64",
                 "--eval-every", "20", *TINY_MODEL, "--threads", "1", "--out", str(out), "--no-progress"]) == 0
    return out / "seed0" / "last" / "model.safetensors", out / "seed0" / "metrics.jsonl"


def _synth(tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "synth"
    assert main(["-q", "synth", "--task", "flip-flop", "--steps", "40", "--batch-size", "8", "--seq-len", "32",
                 "--eval-lengths", "64", "--d-model", "32", "--num-layers", "1", "--threads", "1", "--out", str(out),
                 "--no-progress"]) == 0
    return out / "seed0" / "model.safetensors", out / "seed0" / "metrics.jsonl"


RUNS = {"train": _train, "lra": _lra, "synth": _synth}


@pytest.mark.parametrize("command", sorted(RUNS))
def test_a_40_step_run_computes_what_it_computed(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        weights, metrics = RUNS[command](tmp_path)
    finally:
        torch.set_num_threads(threads)
    got = {"weights_sha256": _weights_sha256(weights), "losses": _last_losses(metrics)}
    assert got["losses"] and all(math.isfinite(v) for v in got["losses"].values())
    record = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    if RECORDING:
        record[command] = {**got, "environment": _machine()}
        RECORD.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        return
    expected = record[command]
    if expected["environment"] == _machine():
        assert got == {k: expected[k] for k in got}, f"spe {command}: a 40-step run no longer computes what it did"
    else:  # another instruction set: other summation orders, only close
        assert set(got["losses"]) == set(expected["losses"])
        for key, value in expected["losses"].items():
            assert got["losses"][key] == pytest.approx(value, rel=1e-3), (command, key)

"""Other packages' attention layers as optional bench rows."""

import json
import sys

import pytest
import torch

from spe.lab.bench import worker
from spe.lab.bench.peers import build_peer_layer
from spe.lab.bench.run import run_bench

CASE = dict(mode="train", positional="ape", impl="-", attention="performer-pytorch", batch=1, length=16,
            num_heads=2, head_dim=8, num_realizations=4, num_sines=2, kernel_size=4, num_features=8,
            chunk_size=8, repeats=1, max_seconds=1)


def test_performer_pytorch_layer_is_causal_when_installed():
    pytest.importorskip("performer_pytorch")
    layer = build_peer_layer("performer-pytorch", num_heads=2, head_dim=8, num_features=8)
    x = torch.randn(1, 16, 16)
    y = layer(x)
    x2 = x.clone()
    x2[:, 9:] += 1.0  # a change at positions ≥ 9 must not reach the outputs before them...
    # ...beyond rounding: its key stabiliser is the max over all positions (future ones too),
    # which moves earlier outputs by ~1e-4 here; leaking attention would move them by ~0.1
    assert torch.allclose(layer(x2)[:, :9], y[:, :9], atol=2e-3)
    assert (layer(x2)[:, 9:] - y[:, 9:]).abs().max() > 0.02
    assert worker.measure_train(CASE, torch.device("cpu"))["median_ms"] > 0
    with pytest.raises(ValueError, match="unknown peer attention 'flash'"):
        build_peer_layer("flash", 2, 8, 8)


def test_a_missing_peer_package_gives_a_skipped_record(monkeypatch, capsys):
    def missing(*args):
        raise ImportError("No module named 'performer_pytorch'")

    monkeypatch.setattr(worker, "build_peer_layer", missing)
    monkeypatch.setattr(sys, "argv", ["worker", json.dumps(CASE)])
    worker.main()
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["skipped"].startswith("performer-pytorch not installed")


def test_peers_are_planned_in_train_mode_with_ape_only(monkeypatch):
    import spe.lab.bench.run as run

    planned = []
    monkeypatch.setattr(run, "run_case", lambda case, timeout: planned.append(case) or {**case, "skipped": "x"})
    monkeypatch.setattr(run, "matmul_gflops", lambda: 1.0)
    run_bench(lengths=[8], modes=["train", "generate"], series=[("ape", "-"), ("sinespe", "-")],
              attentions=["performer", "performer-pytorch"], progress=False)
    peers = {(c["mode"], c["positional"]) for c in planned if c["attention"] == "performer-pytorch"}
    assert peers == {("train", "ape")} and len(planned) == 5

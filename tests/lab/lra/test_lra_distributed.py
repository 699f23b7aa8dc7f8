"""An LRA seed trained by 2 gloo processes equals the same seed trained by 1 process with the same global batch."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import free_port, lra_splits, needs_gloo, records, tiny_lra_config

from spe.lab.lra.train import train_seed

pytestmark = needs_gloo

# Relative tolerance of the 2-process training losses against the 1-process ones. The runs differ
# only in float32 rounding: one process averages the cross-entropy over B examples and cuts the batch
# to its longest sequence; two average over B/2 each (each slice cut to its own longest sequence, so
# the attention sums run over other lengths) and DDP averages their gradients. Each such sum carries a
# relative rounding of a few units of float32's u = 6e-8 (pairwise sums over at most B·L·C = 4·11·16
# terms: ~log2(704) u ≈ 10u ≈ 6e-7). AdamW passes a relative change of a gradient through to the
# update at the same relative size (m/√v, gradients well above eps = 1e-8), so after N = 6 steps the
# weights, hence the losses, differ by about N × 6e-7 ≈ 4e-6 relative if nothing amplifies it; we
# allow 2e-5 (5× that, for the curvature of the tiny model over 6 steps).
RTOL = 2e-5
# Weights: AdamW's step is lr·m/√v, of size ≈ lr for any gradient well above eps, so a relative
# gradient change δ moves a weight by ≈ δ·lr per step, N·δ·lr after N steps (lr = 1e-3 peak, δ ≈ 6e-7:
# 4e-9); a gradient entry at rounding level can flip the direction of its update, up to 2·lr per step,
# so we bound |Δw| by the distance Adam can move a weight in N steps, 2·N·lr = 1.2e-2, and require the
# typical (median) entry to sit at the rounding level (below 1e-6).
STEPS, LR = 6, 1e-3


def _cfg():
    return tiny_lra_config(steps=STEPS, lr=LR, warmup_steps=2, eval_every=2)  # dropout 0: masks are per process


def _worker(rank: int, port: int, folder: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    result = train_seed(_cfg(), lra_splits(), 0, folder, progress=False)
    with open(f"{folder}/rank{rank}.json", "w") as fh:
        json.dump(result, fh)


@pytest.mark.slow
def test_two_processes_train_a_seed_as_one_does(tmp_path):
    import torch.multiprocessing as mp

    one = train_seed(_cfg(), lra_splits(), 0, tmp_path / "one", progress=False)
    mp.spawn(_worker, args=(free_port(), str(tmp_path / "two")), nprocs=2)
    two = [json.loads((tmp_path / "two" / f"rank{r}.json").read_text()) for r in range(2)]
    assert {**two[0], "seconds": 0} == {**two[1], "seconds": 0}  # every process returns the same result (test accuracy summed over processes)
    keys = ("test_accuracy", "val_accuracy", "best_step", "steps", "num_parameters")
    assert {k: two[0][k] for k in keys} == {k: one[k] for k in keys}
    a, b = records(tmp_path / "one"), records(tmp_path / "two")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [2, 4, 6]
    for r1, r2 in zip(a, b):
        assert r2["train_loss"] == pytest.approx(r1["train_loss"], rel=RTOL)
        assert r2["val_accuracy"] == r1["val_accuracy"]
    state = torch.load(tmp_path / "two" / "train_state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["rng"]) == 2
    w1, w2 = (load_file(str(tmp_path / f / "last" / "model.safetensors")) for f in ("one", "two"))
    diffs = torch.cat([(w1[k] - w2[k]).abs().flatten() for k in w1])
    assert float(diffs.max()) <= 2 * STEPS * LR and float(diffs.median()) < 1e-6
    assert float(diffs.max()) > 0  # two processes really computed differently (not one run copied)


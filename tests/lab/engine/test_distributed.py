"""torchrun with 2 gloo processes on loopback: the same losses as one process with the same global batch."""

import json
import shutil

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from tiny_run import RTOL, needs_gloo, records, tiny_config, torchrun

from spe.checkpoint import MODEL_FILE, TRAIN_STATE_FILE
from spe.lab.music.train import train
from spe.lab.engine.state import CHECKPOINTS_DIR

pytestmark = needs_gloo


@pytest.mark.slow
def test_two_processes_match_one_with_the_same_global_batch_and_resume_identically(tmp_path):
    # Dropout off: its masks are drawn per process (as they would be per slice), so they
    # cannot match one process's; everything else (crops, SPE codes, features) is shared.
    def config(name, **kw):
        return tiny_config(tmp_path, name, model={"dropout": 0.0}, **kw)

    one = train(config("one"), progress=False)
    two = tmp_path / "two"
    torchrun(config("two"), tmp_path / "two.toml")
    a, b = records(one), records(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 7))
    for r1, r2 in zip(a, b):
        assert r2["loss"] == pytest.approx(r1["loss"], rel=RTOL)
        assert r2["lr"] == r1["lr"]
        for key in ("val_loss", "val_loss_beyond"):
            assert (r1.get(key) is None) == (r2.get(key) is None)
            if r1.get(key) is not None:
                assert r2[key] == pytest.approx(r1[key], rel=RTOL)
    assert b[0]["loss"] != b[1]["loss"]  # the loss moves: the comparison is not of constants
    state = torch.load(two / TRAIN_STATE_FILE, weights_only=True)
    assert state["world_size"] == 2 and len(state["rng"]) == 2
    assert not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])  # per-process dropout streams

    # Two processes, twice: resume a copy of the step-4 checkpoint with 2 processes -> the same
    # losses and weights, bit for bit.
    again = tmp_path / "again"
    step4 = again / CHECKPOINTS_DIR / "step-0000004"
    shutil.copytree(two / CHECKPOINTS_DIR / "step-0000004", step4)
    for name in (MODEL_FILE, TRAIN_STATE_FILE):
        shutil.copyfile(step4 / name, again / name)
    (again / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in b[:4]))
    torchrun(config("again"), tmp_path / "again.toml", "--resume")
    assert [r["loss"] for r in records(again)] == [r["loss"] for r in b]
    w2, w3 = load_file(str(two / MODEL_FILE)), load_file(str(again / MODEL_FILE))
    assert all(torch.equal(w2[k], w3[k]) for k in w2)

    # One process cannot resume a two-process run: its crop slices and random states are per process.
    with pytest.raises(ValueError, match=r"2 process\(es\), now 1.*nproc-per-node 2"):
        train(config("two", steps=8), resume=True, progress=False)


def test_the_global_batch_must_split_evenly(tmp_path, monkeypatch):
    from spe.lab.engine import distributed

    monkeypatch.setattr(distributed, "setup", lambda device_type: distributed.Distributed(0, 3, 0))
    with pytest.raises(ValueError, match="batch_size 4 .*global batch.* 3 processes"):
        train(tiny_config(tmp_path, "x"), progress=False)
    assert not (tmp_path / "x").exists()


def test_shard_takes_this_ranks_rows():
    from spe.lab.engine.distributed import Distributed, shard

    batch = torch.arange(12).reshape(6, 2)
    parts = [shard(batch, Distributed(rank, 3, rank)) for rank in range(3)]
    assert torch.equal(torch.cat(parts), batch) and all(len(p) == 2 for p in parts)
    assert shard(batch, Distributed()) is batch


def _group_worker(rank: int, init_file: str, results: str) -> None:
    from spe.lab.engine.distributed import Distributed, all_sum, check_same

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    ctx, cpu = Distributed(rank, 2, rank), torch.device("cpu")
    found = {"sum": all_sum([1.0 + rank, 0.1], ctx, cpu)}
    check_same(torch.Generator().manual_seed(5).get_state(), "a shared generator", ctx, cpu)  # equal: passes
    try:
        check_same(torch.Generator().manual_seed(rank).get_state(), "the SPE code generator", ctx, cpu)
        found["raised"] = None
    except RuntimeError as err:
        found["raised"] = str(err)
    dist.destroy_process_group()
    with open(f"{results}/{rank}.json", "w") as fh:
        json.dump(found, fh)


@pytest.mark.slow
def test_generators_that_differ_between_processes_are_caught_and_sums_are_exact(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_group_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    for rank in range(2):
        found = json.loads((tmp_path / f"{rank}.json").read_text())
        assert found["sum"] == [3.0, 0.2]  # float64 on the wire: 0.1 + 0.1 exactly as in float64
        assert found["raised"].startswith("the SPE code generator differs between the 2 processes")

"""Crash-safe runs: the last K checkpoints, every random state, a resume on the same trajectory."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import tiny_config

from spe.checkpoint import MODEL_FILE, TRAIN_STATE_FILE, load_metadata
from spe.lab.engine import core as engine
from spe.lab.music.train import train
from spe.lab.engine.state import CHECKPOINTS_DIR, latest_checkpoint, repair_run_folder


def _losses(run) -> list[tuple]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r.get("val_loss")) for r in rows]


class _Crash(BaseException):
    """Stands for a kill right after a checkpoint: nothing after it runs (not an Exception, like SIGKILL)."""


@pytest.mark.slow
def test_resume_after_a_crash_continues_the_same_trajectory_bit_for_bit(tmp_path, monkeypatch):
    straight = train(tiny_config(tmp_path, "straight"), progress=False)
    again = train(tiny_config(tmp_path, "again"), progress=False)
    # same seed, one process, twice: identical losses (determinism on CPU)
    assert _losses(straight) == _losses(again)

    save = engine._Training.save

    def save_then_crash(run, *args):
        save(run, *args)
        if run.step == 4:
            raise _Crash

    monkeypatch.setattr(engine._Training, "save", save_then_crash)
    cfg = tiny_config(tmp_path, "crashed")
    with pytest.raises(_Crash):
        train(cfg, progress=False)
    monkeypatch.setattr(engine._Training, "save", save)
    assert load_metadata(cfg.out)["step"] == 4
    resumed = train(cfg, resume=True, progress=False)
    # 2N = 6 steps straight vs N = 4, crash, resume to 6 (dropout, feature redraw at step 3 and
    # crops all continue): bit-identical losses, validation and weights on CPU
    assert _losses(resumed) == _losses(straight)
    a, b = load_file(str(straight / MODEL_FILE)), load_file(str(resumed / MODEL_FILE))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_keeps_the_last_k_checkpoints_and_links_the_latest(tmp_path):
    run = train(tiny_config(tmp_path, "run", keep_checkpoints=2), progress=False)
    kept = sorted(p.name for p in (run / CHECKPOINTS_DIR).iterdir())
    assert kept == ["step-0000004", "step-0000006"]
    newest = run / CHECKPOINTS_DIR / "step-0000006"
    for name in (MODEL_FILE, TRAIN_STATE_FILE):
        assert (run / name).read_bytes() == (newest / name).read_bytes()
    state = torch.load(run / TRAIN_STATE_FILE, weights_only=True)
    assert state["step"] == 6 and state["world_size"] == 1 and state["format_version"] == 2
    assert {"torch", "python", "numpy"} <= set(state["rng"][0])
    assert {"data_gen", "code_gen", "feature_gen", "optimizer", "scaler"} <= set(state)
    assert not list(run.rglob("*.tmp"))  # no temporary file left behind
    assert oct(os.stat(run / MODEL_FILE).st_mode & 0o777) != "0o600"  # usual permissions, not mkstemp's


@pytest.mark.slow
def test_a_crash_between_the_two_renames_is_repaired_to_a_matching_pair(tmp_path):
    run = train(tiny_config(tmp_path, "run", steps=4, keep_checkpoints=3), progress=False)
    older = run / CHECKPOINTS_DIR / "step-0000002"
    # the run folder's state is at step 4 but its model at step 2: what a kill between the
    # two renames of the next checkpoint would look like, one step behind
    (run / MODEL_FILE).unlink()
    os.link(older / MODEL_FILE, run / MODEL_FILE)
    assert load_metadata(run)["step"] == 2
    assert repair_run_folder(run) == 4
    assert load_metadata(run)["step"] == 4
    assert torch.load(run / TRAIN_STATE_FILE, weights_only=True)["step"] == 4
    # an incomplete newest folder (state written, model not yet) is not a checkpoint
    partial = run / CHECKPOINTS_DIR / "step-0000006"
    partial.mkdir()
    (partial / TRAIN_STATE_FILE).write_bytes((run / TRAIN_STATE_FILE).read_bytes())
    assert latest_checkpoint(run) == run / CHECKPOINTS_DIR / "step-0000004"


@pytest.mark.slow
def test_overwrite_replaces_a_run_and_only_its_files(tmp_path):
    run = train(tiny_config(tmp_path, "run", steps=6, keep_checkpoints=3), progress=False)
    (run / "notes.txt").write_text("the user's own file")
    with pytest.raises(ValueError, match="holds a run of another configuration .*d_model 32 -> 16.*--overwrite"):
        train(tiny_config(tmp_path, "run", steps=2, model={"d_model": 16}), progress=False)
    with pytest.raises(ValueError, match="pass one of them"):
        train(tiny_config(tmp_path, "run"), resume=True, overwrite=True, progress=False)
    train(tiny_config(tmp_path, "run", steps=2, model={"d_model": 16}), overwrite=True, progress=False)
    assert load_metadata(run)["config"]["d_model"] == 16 and load_metadata(run)["step"] == 2
    assert sorted(p.name for p in (run / CHECKPOINTS_DIR).iterdir()) == ["step-0000002"]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run / "notes.txt").read_text() == "the user's own file"

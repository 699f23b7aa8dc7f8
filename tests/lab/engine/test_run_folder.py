"""A run folder belongs to one run: the lock, --overwrite removing spe's files only."""

import fcntl
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file
from tiny_run import PYTHON, hold_lock, subprocess_env, tiny_config, toml_text

from spe.lab.cli.main import main
from spe.lab import plans
from spe.lab.plans import load_plan
from spe.lab.music.train import train
from spe.lab.engine.metrics_log import read_records
from spe.lab.engine.run_folder import LOCK_FILE, RunFolderBusy, check_name, run_lock


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _foreign_files(root: Path) -> None:
    """What another tool keeps in a folder, with some of spe's file names."""
    for name, text in (("checkpoints/lightning/epoch=99.ckpt", "lightning"), ("tensorboard/events.out.tfevents.1.host",
                       "their events"), ("metrics.jsonl", '{"epoch": 1}\n'), ("loss.png", "their plot"),
                       ("notes.txt", "mine")):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_overwrite_refuses_a_folder_that_holds_no_spe_run_and_changes_nothing(tmp_path, capsys):
    cfg = tiny_config(tmp_path, "theirs", steps=2)
    (tmp_path / "run.toml").write_text(toml_text(cfg))
    _foreign_files(Path(cfg.out))
    before = _snapshot(Path(cfg.out))
    for flags in (["--overwrite"], []):
        code = main(["train", "--config", str(tmp_path / "run.toml"), "--no-progress", *flags])
        assert code == 2
        err = capsys.readouterr().err
        assert "holds no spe run" in err and "(metrics.jsonl, loss.png)" in err
        assert len(err.strip().splitlines()) == 1
        assert _snapshot(Path(cfg.out)) == before


@pytest.mark.slow
def test_overwrite_removes_spe_files_and_keeps_every_other_file(tmp_path):
    run = train(tiny_config(tmp_path, "run", steps=4, keep_checkpoints=3), progress=False)
    foreign = {"checkpoints/lightning/epoch=99.ckpt": "lightning", "tensorboard/events.out.tfevents.1.host": "theirs",
               "checkpoints/step-0000004/README": "a note beside a unit", "best/notes.txt": "kept", "notes.txt": "mine"}
    for name, text in foreign.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)
    train(tiny_config(tmp_path, "run", steps=2, model={"d_model": 16}), overwrite=True, progress=False)
    for name, text in foreign.items():
        assert (run / name).read_text() == text, name
    units = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert units == ["lightning", "step-0000002", "step-0000004"]
    assert sorted(p.name for p in (run / "checkpoints" / "step-0000004").iterdir()) == ["README"]
    assert [r["step"] for r in read_records(run / "metrics.jsonl")] == [1, 2]
    assert not (run / LOCK_FILE).exists()  # released with the run


@pytest.mark.slow
def test_a_second_process_on_a_held_folder_is_refused_naming_the_holder(tmp_path):
    cfg = tiny_config(tmp_path, "run", steps=2)
    holder = hold_lock(Path(cfg.out))
    try:
        with pytest.raises(RunFolderBusy, match=rf"{cfg.out} .*in use.*PID {holder.pid}"):
            train(cfg, progress=False)
        assert sorted(p.name for p in Path(cfg.out).iterdir()) == [LOCK_FILE]  # nothing written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    train(cfg, progress=False)  # the kernel released the dead holder's lock
    assert [r["step"] for r in read_records(Path(cfg.out) / "metrics.jsonl")] == [1, 2]


def test_a_holder_caught_before_it_writes_its_pid_is_named_as_such(tmp_path):
    # the window between flock and writing the PID: two trainings started together can meet in it
    folder = tmp_path / "run"
    folder.mkdir()
    with open(folder / LOCK_FILE, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunFolderBusy, match=rf"{folder} is in use by another spe process \(a process that "
                                                r"has not written its PID yet\)"):
            with run_lock(folder):
                pass
    assert (folder / LOCK_FILE).read_text() == ""  # the refused process wrote nothing into the holder's file


def test_the_lock_is_reentrant_within_a_process_and_removes_the_folder_it_created_empty(tmp_path):
    folder = tmp_path / "new"
    with run_lock(folder), run_lock(folder):
        assert (folder / LOCK_FILE).read_text().strip() == str(os.getpid())
    assert not folder.exists()


def test_the_lock_removes_the_parents_it_created_and_keeps_what_holds_anything(tmp_path):
    # spe demo's --out/POSITIONAL: a refused run leaves no empty --out behind
    with run_lock(tmp_path / "out" / "sinespe"):
        pass
    assert not (tmp_path / "out").exists()
    (tmp_path / "kept").mkdir()
    with run_lock(tmp_path / "kept" / "a" / "b"):
        (tmp_path / "kept" / "a" / "note.txt").write_text("a user's file")
    assert not (tmp_path / "kept" / "a" / "b").exists()
    assert (tmp_path / "kept" / "a" / "note.txt").exists() and (tmp_path / "kept").is_dir()


@pytest.mark.slow
def test_two_trainings_started_together_leave_one_undisturbed_run(tmp_path):
    cfg = tiny_config(tmp_path, "shared", steps=6)
    (tmp_path / "run.toml").write_text(toml_text(cfg))
    command = [PYTHON, "-m", "spe", "train", "--config", str(tmp_path / "run.toml"), "--no-progress"]
    procs = [subprocess.Popen(command, stderr=subprocess.PIPE, env=subprocess_env(), text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    # refused while the other runs (the lock, whose holder may not have written its PID yet) or, if it came
    # late, by the finished run it found
    assert "in use by another spe process (" in refused or "already holds a checkpoint" in refused, refused
    steps = [r["step"] for r in read_records(Path(cfg.out) / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4, 5, 6]
    alone = train(tiny_config(tmp_path, "alone", steps=6), progress=False)
    shared, undisturbed = load_file(str(Path(cfg.out) / "model.safetensors")), load_file(str(alone / "model.safetensors"))
    assert shared.keys() == undisturbed.keys()
    assert all((shared[k] == undisturbed[k]).all() for k in shared)


# one variant, one seed, two steps: the smallest sweep that trains
PLAN = ("seeds = [0]\nseq_len = 16\nbatch_size = 2\nsteps = 2\neval_every = 2\nthreads = 1\n"
        "model = { d_model = 16, num_layers = 1, num_heads = 2, d_ff = 32 }\n"
        '[variants.ape]\nmodel = { positional = "ape" }\n')


@pytest.mark.slow
def test_a_sweep_runner_is_refused_a_run_another_process_holds(tmp_path):
    (tmp_path / "plan.toml").write_text(PLAN)
    data = tiny_config(tmp_path, "unused").data
    holder = hold_lock(tmp_path / "sweep" / "ape" / "seed0")
    try:
        with pytest.raises(RunFolderBusy, match=rf"ape/seed0 .*in use.*PID {holder.pid}"):
            plans.run(load_plan(str(tmp_path / "plan.toml"), "music"), tmp_path / "sweep", data=data,
                      cache_dir=str(tmp_path / "cache"), progress=False)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert not (tmp_path / "sweep" / "ape" / "seed0" / "model.safetensors").exists()
    doc = plans.run(load_plan(str(tmp_path / "plan.toml"), "music"), tmp_path / "sweep", data=data,
                    cache_dir=str(tmp_path / "cache"), progress=False)
    assert list(doc["runs"]) == ["ape/seed0"]
    assert json.loads((tmp_path / "sweep" / "results.json").read_text())["runs"]["ape/seed0"]["step"] == 2


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "/abs", ".hidden", "a..b", "tab\tname", " pad",
                                  "results.json", "results.md", "Results.MD", "loss.png", "x" * 300, "é" * 128])
def test_check_name_refuses_anything_but_a_plain_name(name):
    with pytest.raises(ValueError, match="plan p, row r: the name"):
        check_name(name, "plan p, row r")


def test_check_name_accepts_the_names_plans_use():
    for name in ("ape", "sinespe-k5", "gate-init-plus2", "pos-lr-0.1", "sinespe_R32"):
        assert check_name(name, "x") == name

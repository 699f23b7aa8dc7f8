"""``spe train --resume`` continues the run's own configuration (spe.lab.music.config.resume_config),
and a run folder is used only by the task that wrote it (spe.lab.engine.run_folder.check_task)."""

import json
import re
import warnings

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tiny_run import clean_midi, rewrite_header, tiny_config

from spe.checkpoint import load_metadata
from spe.lab.cli.main import main
from spe.lab.music.train import train
from spe.lab.engine.run_folder import check_task, recorded_task

# A run of the user's folder with a model unlike the packaged demo's (d_model 256, sineSPE).
FLAGS = ["--d-model", "32", "--num-layers", "1", "--num-heads", "2",
         "--positional", "ape-learned", "--max-positions", "40", "--attention", "softmax",
         "--seq-len", "32", "--batch-size", "4", "--lr", "0.003", "--warmup-steps", "2", "--eval-every", "2",
         "--threads", "1", "--no-progress"]


def _snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(run folder, data folder, cache) of a 4-step run trained by ``spe train --data DIR`` with FLAGS."""
    root = tmp_path_factory.mktemp("resume")
    data, cache, out = clean_midi(root / "mymidi"), root / "cache", root / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one validation piece of six
        assert main(["-q", "train", "--data", str(data), "--cache-dir", str(cache), "--out", str(out),
                     "--steps", "4", *FLAGS]) == 0
    return out, data, cache


def _resume(out, *flags):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return main(["-q", "train", "--out", str(out), "--resume", "--no-progress", *flags])


@pytest.mark.slow
def test_resume_takes_every_option_from_the_run_and_steps_may_grow(run, capsys):
    out, data, cache = run
    assert _resume(out, "--steps", "6") == 0, capsys.readouterr().err
    meta = load_metadata(out)
    assert meta["step"] == 6 and meta["task"] == "train"
    assert meta["train"]["data"] == str(data) and meta["train"]["cache_dir"] == str(cache)
    assert (meta["config"]["d_model"], meta["config"]["positional"], meta["train"]["lr"]) == (32, "ape-learned", 0.003)
    # the same values given again, the data folder by another spelling, and run-time options are taken
    assert _resume(out, "--steps", "8", "--d-model", "32", "--lr", "0.003", "--data", f"{data}/",
                   "--threads", "1", "--keep-checkpoints", "3") == 0, capsys.readouterr().err
    assert load_metadata(out)["step"] == 8


@pytest.mark.slow
@pytest.mark.parametrize("flags,message", [
    (["--d-model", "64"], r"was trained with d_model 32; --d-model gives 64"),
    (["--batch-size", "2"], r"was trained with batch_size 4; --batch-size gives 2"),
    (["--seq-len", "16"], r"was trained with seq_len 32; --seq-len gives 16"),
    (["--positional", "sinespe"], r"was trained with positional 'ape-learned'; --positional gives 'sinespe'"),
    (["--data", "music21:palestrina"], r"was trained with data '\S+/mymidi'; --data gives 'music21:palestrina'"),
    (["--steps", "2"], r"has trained \d+ steps; --steps 2 would end before them"),
])
def test_a_flag_that_disagrees_with_the_run_is_refused_naming_both_values(run, flags, message, capsys):
    out, _, _ = run
    before = _snapshot(out)
    capsys.readouterr()
    assert _resume(out, *flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
    assert err[0].startswith(f"spe train: error: --resume: {out} ")
    assert _snapshot(out) == before


@pytest.mark.slow
def test_a_config_file_given_with_resume_must_agree_too(run, tmp_path, capsys):
    out, _, _ = run
    (tmp_path / "other.toml").write_text("warmup_steps = 5\n[model]\nd_model = 32\n")
    assert main(["train", "--config", str(tmp_path / "other.toml"), "--out", str(out), "--resume"]) == 2
    assert re.search(r"was trained with warmup_steps 2; config file \S+other\.toml gives 5",
                     capsys.readouterr().err)


@pytest.mark.slow
def test_an_unknown_option_given_with_resume_is_one_line(run, tmp_path, capsys):
    out, _, _ = run
    assert _resume(out, "--model-option", "bogus=1") == 2
    assert re.match(r"spe train: error: unknown model option\(s\) \['bogus'\]; known: \[", capsys.readouterr().err)
    (tmp_path / "bogus.toml").write_text("bogus = 1\n")
    assert main(["train", "--config", str(tmp_path / "bogus.toml"), "--out", str(out), "--resume"]) == 2
    assert re.match(rf"spe train: error: config file {tmp_path}/bogus\.toml: unknown training option\(s\) \['bogus'\]",
                    capsys.readouterr().err)


@pytest.mark.slow
def test_train_and_synth_refuse_each_others_run_folders(run, tmp_path, capsys):
    out, _, _ = run
    synth = tmp_path / "synth"
    tiny = ["--steps", "2", "--eval-every", "2", "--eval-lengths", "128", "--d-model", "16", "--num-layers", "1",
            "--num-heads", "2", "--threads", "1", "--no-progress"]
    assert main(["-q", "synth", "--task", "flip-flop", "--out", str(synth), *tiny]) == 0
    seed = synth / "seed0"
    for flags in (["--resume"], []):
        before = _snapshot(seed)
        capsys.readouterr()
        assert main(["-q", "train", "--out", str(seed), "--steps", "8", "--no-progress", *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"spe train: error: {seed} ") and len(err.splitlines()) == 1, err
        assert all(fact in err for fact in ("spe synth", str(seed / "model.safetensors"), "--out")), err
        assert _snapshot(seed) == before
    # the reverse: a train run as a synth seed's folder
    mine = tmp_path / "mine"
    (mine / "seed0").mkdir(parents=True)
    for path in out.rglob("*"):
        if path.is_file() and path.name != ".lock":
            target = mine / "seed0" / path.relative_to(out)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    before = _snapshot(mine / "seed0")
    assert main(["-q", "synth", "--task", "flip-flop", "--out", str(mine), *tiny]) == 2
    assert f"{mine / 'seed0'} holds a run of spe train" in capsys.readouterr().err
    assert _snapshot(mine / "seed0") == before


def test_the_task_of_a_checkpoint_written_before_the_field_is_known_by_its_options():
    assert recorded_task({"task": "synth", "train": {}}) == "synth"
    assert recorded_task({"train": {"seq_len": 32}}) == "train"
    assert recorded_task({"synth": {}}) == "synth" and recorded_task({"lra": {}}) == "lra"
    assert recorded_task({"step": 3}) is None


@pytest.mark.slow
def test_an_old_run_folder_without_the_task_field_still_resumes(tmp_path, capsys):
    cfg = tiny_config(tmp_path, "old", steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(cfg, progress=False)
    for model in (tmp_path / "old").rglob("model.safetensors"):  # as an older spe wrote them: no "task"
        with safe_open(str(model), framework="pt") as f:
            header = dict(f.metadata())
        meta = json.loads(header["spe_metadata"])
        del meta["task"]
        header["spe_metadata"] = json.dumps(meta)
        tensors = load_file(str(model))
        model.unlink()  # the run folder's file is a hard link of the newest unit's
        save_file(tensors, str(model), metadata=header)
    assert "task" not in load_metadata(tmp_path / "old")
    check_task(tmp_path / "old", "", "train")
    assert _resume(tmp_path / "old", "--steps", "4") == 0, capsys.readouterr().err
    assert load_metadata(tmp_path / "old")["step"] == 4



@pytest.mark.slow
def test_a_moved_run_resumes_where_it_is_and_the_original_is_untouched(run, tmp_path, monkeypatch, capsys):
    import shutil

    out, _, _ = run
    monkeypatch.chdir(tmp_path)
    moved = tmp_path / "runs" / "default"  # --out's default: the run is found there, and trains there
    shutil.copytree(out, moved, ignore=shutil.ignore_patterns(".lock"))
    before, step = _snapshot(out), load_metadata(out)["step"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["-q", "train", "--resume", "--steps", str(step + 2), "--no-progress"]) == 0, \
            capsys.readouterr().err
    assert load_metadata(moved)["step"] == step + 2 and _snapshot(out) == before


@pytest.mark.slow
def test_an_lra_seed_folder_holding_a_train_run_is_refused_naming_both(run, tmp_path):
    out, _, _ = run
    seed = tmp_path / "experiment" / "seed0"
    rewrite_header(out / "model.safetensors", seed / "last")  # LRA keeps its latest model in last/
    with pytest.raises(ValueError, match=rf"^{seed} .*spe train \({seed}/last/model\.safetensors\).*spe lra.*--out"):
        check_task(seed, "last", "lra")
    check_task(seed, "last", "train")

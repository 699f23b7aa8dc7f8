"""SIGKILL at random moments: the latest checkpoint always loads and training resumes to the same end."""

import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import PYTHON, subprocess_env, tiny_config, toml_text

from spe.checkpoint import MODEL_FILE, load, load_metadata
from spe.lab.music.train import train
from spe.lab.engine.state import latest_checkpoint

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")


def _metrics_lines(run) -> int:
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume(tmp_path):
    # A checkpoint every 3 steps; each kill comes 1-12 steps after the restart's first step, then
    # 0-40 ms later (about one step): moments inside a step, inside validation or a checkpoint.
    cfg = tiny_config(tmp_path, "killed", steps=90, eval_every=3, warmup_steps=10)
    (tmp_path / "tiny.toml").write_text(toml_text(cfg))
    command = [PYTHON, "-m", "spe", "-q", "train", "--config", str(tmp_path / "tiny.toml"), "--no-progress"]
    run = tmp_path / "killed"
    rng = random.Random(12)
    moments = [(rng.randint(1, 12), rng.uniform(0, 0.04)) for _ in range(5)]
    steps_at_kill = []
    for steps_after, delay_s in moments:
        resume = latest_checkpoint(run) is not None
        proc = subprocess.Popen(command + (["--resume"] if resume else []), env=subprocess_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        before = _metrics_lines(run) if resume else 0
        deadline = time.monotonic() + 60
        while (_metrics_lines(run) < before + steps_after and proc.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.005)
        time.sleep(delay_s)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
        newest = latest_checkpoint(run)
        assert newest is not None
        loaded = load(newest)  # loads, weights and header intact
        steps_at_kill.append(loaded.step)
        assert loaded.step % 3 == 0 and load_metadata(run)["step"] in (loaded.step, loaded.step - 3)
    done = subprocess.run(command + ["--resume"], env=subprocess_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert load_metadata(run)["step"] == 90
    assert steps_at_kill == sorted(steps_at_kill) and steps_at_kill[-1] < 90
    # five kills later, the same weights as one uninterrupted run (in this process)
    straight = train(tiny_config(tmp_path, "straight", steps=90, eval_every=3, warmup_steps=10),
                     progress=False)
    a, b = load_file(str(straight / MODEL_FILE)), load_file(str(run / MODEL_FILE))
    assert all(torch.equal(a[k], b[k]) for k in a)

"""Shared by the tests of spe app: a tiny music run (trained 2 steps), its export and its
evaluation, a prompt MIDI file, the small soundfont pretty_midi ships, the page served."""

import importlib.util
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from tiny_run import free_port, subprocess_env, tiny_config

# The soundfont every test renders with, whatever the machine has: pretty_midi's TimGM6mb.
SOUNDFONT = str(Path(importlib.util.find_spec("pretty_midi").origin).parent / "TimGM6mb.sf2")
# What the tests generate: short and near greedy (seed fixed): a few notes of the prompt's instruments,
# none where TimGM6mb has no sample (symusic's synthesizer, where FluidSynth is absent, hangs there).
GENERATION = {"length": 64, "top_p": 0.1, "temperature": 0.05, "seed": 0}


@pytest.fixture(scope="session")
def music_run(tmp_path_factory) -> Path:
    """A tiny music run trained for 2 steps, evaluated beside it (RUN-evaluation, as spe sweep does)."""
    from spe.lab.cli.main import main
    from spe.lab.music.train import train

    root = tmp_path_factory.mktemp("app")
    run = train(tiny_config(root, "run", steps=2, eval_every=2, warmup_steps=1), progress=False)
    assert main(["-q", "evaluate", "--checkpoint", str(run), "--out", str(root / "run-evaluation"),
                 "--eval-length", "64", "--no-progress"]) == 0
    return run


@pytest.fixture(scope="session")
def exported(music_run) -> Path:
    """The run exported by spe export (transformers and MidiTok's files)."""
    from spe.lab.cli.main import main

    out = music_run.parent / "export"
    assert main(["export", str(music_run), "--out", str(out)]) == 0
    return out


@pytest.fixture
def prompt(music_run) -> Path:
    """A MIDI file of the run's corpus, as a user would upload it."""
    return music_run.parent / "clean_midi" / "piece0.mid"


@pytest.fixture(autouse=True)
def soundfont(monkeypatch) -> str:
    monkeypatch.setenv("SPE_SOUNDFONT", SOUNDFONT)
    return SOUNDFONT


@pytest.fixture
def generation() -> dict:
    """The page's generation settings the tests use (GENERATION)."""
    return dict(GENERATION)


def _wav_peak(data: bytes) -> int:
    import io
    import wave

    import numpy as np

    with wave.open(io.BytesIO(data)) as w:
        assert w.getsampwidth() == 2 and w.getnframes() > 0
        samples = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    return int(np.abs(samples.astype(np.int32)).max(initial=0))


@pytest.fixture
def wav_peak():
    """The largest absolute 16-bit sample of WAV bytes (a WAV of no frames fails)."""
    return _wav_peak


@pytest.fixture(scope="session")
def served(music_run, tmp_path_factory):
    """``spe app --run RUN`` in a child process on a free port: yields its URL, then stops it with
    Ctrl-C (SIGINT) and checks that its temporary folder of generated files is gone."""
    tmp_path = tmp_path_factory.mktemp("served")
    port = free_port()
    (tmp_path / "tmp").mkdir()
    env = {**subprocess_env(), "SPE_SOUNDFONT": SOUNDFONT, "GRADIO_ANALYTICS_ENABLED": "False",
           "TMPDIR": str(tmp_path / "tmp")}
    log = (tmp_path / "app.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "spe", "app", "--run", str(music_run), "--port", str(port),
                             "--threads", "1"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(300):
            if proc.poll() is not None:
                raise AssertionError(f"spe app exited: {(tmp_path / 'app.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(url, timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise AssertionError(f"spe app did not answer at {url}: {(tmp_path / 'app.log').read_text()[-2000:]}")
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)  # Gradio's shutdown takes seconds, more on a loaded machine
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    assert not list((tmp_path / "tmp").glob("spe-app-*")), "spe app left its temporary folder"

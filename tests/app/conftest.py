"""Shared by the tests of spe app: a tiny music run (trained 2 steps), its export and its
evaluation, a prompt MIDI file, the small soundfont pretty_midi ships, the page served."""

import contextlib
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


@contextlib.contextmanager
def app_process(music_run: Path, folder: Path, stop: signal.Signals = signal.SIGINT):
    """``spe app --run RUN`` in a child process on a free port, its TMPDIR in ``folder``: yields its
    URL, then stops it with ``stop`` and checks that it exited by itself within 60 s (Gradio's
    shutdown takes seconds, more on a loaded machine) and that its folder of generated files is gone."""
    port = free_port()
    (folder / "tmp").mkdir()
    env = {**subprocess_env(), "SPE_SOUNDFONT": SOUNDFONT, "GRADIO_ANALYTICS_ENABLED": "False",
           "TMPDIR": str(folder / "tmp")}
    log = (folder / "app.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "spe", "app", "--run", str(music_run), "--port", str(port),
                             "--threads", "1"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
    url = f"http://127.0.0.1:{port}/"
    killed = False
    try:
        for _ in range(300):
            if proc.poll() is not None:
                raise AssertionError(f"spe app exited: {(folder / 'app.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(url, timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise AssertionError(f"spe app did not answer at {url}: {(folder / 'app.log').read_text()[-2000:]}")
        yield url
    finally:
        proc.send_signal(stop)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            killed = True
            proc.kill()
            proc.wait()
        log.close()
    assert not list((folder / "tmp").glob("spe-app-*")), f"spe app left its temporary folder ({stop.name})"
    assert not killed, f"spe app did not stop within 60 s of {stop.name}"


@pytest.fixture(scope="session")
def served(music_run, tmp_path_factory):
    """The page served (app_process), stopped with Ctrl-C (SIGINT) at the end of the session."""
    with app_process(music_run, tmp_path_factory.mktemp("served")) as url:
        yield url


@pytest.fixture
def serve_app(music_run):
    """app_process for one test: ``with serve_app(folder, stop) as url: ...``."""
    return lambda folder, stop=signal.SIGINT: app_process(music_run, folder, stop)

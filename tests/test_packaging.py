"""What the package declares matches what it ships and what its code needs: the licence
pyproject names is the LICENSE file's, the torch floor covers the newest torch API the
library uses, and the wheel, installed alone, ships every file and runs every command."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from tiny_run import clean_midi

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

# torch APIs the library uses, each with the torch release that introduced it. The floor in
# pyproject must be at least the newest of those the code uses (nn.RMSNorm: the output norm of
# normaliser-free kernels, spe.attention.layer).
NEWEST_APIS = {"nn.RMSNorm": (2, 4)}


def _torch_floor() -> tuple[int, int]:
    spec = next(d for d in PYPROJECT["project"]["dependencies"] if re.match(r"torch\b", d))
    match = re.fullmatch(r"torch>=(\d+)\.(\d+)", spec.replace(" ", ""))
    assert match, f"torch dependency {spec!r} is not of the form torch>=X.Y"
    return int(match[1]), int(match[2])


def test_the_torch_floor_covers_the_apis_the_library_uses():
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "src" / "spe").rglob("*.py"))
    used = {api: version for api, version in NEWEST_APIS.items() if api in source}
    assert used, "none of NEWEST_APIS is used any more: update the table (and maybe the floor)"
    assert _torch_floor() >= max(used.values()), (used, _torch_floor())


def test_the_licence_file_is_the_one_pyproject_names():
    assert PYPROJECT["project"]["license"] == {"text": "MIT"}
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "Copyright (c) 2026 the spe authors" in text


def _run(argv: list, cwd: Path) -> subprocess.CompletedProcess:
    """``argv`` in ``cwd`` with this checkout off the import path (PYTHONPATH unset), one thread."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{argv[:3]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def _purelib(python: Path) -> Path:
    out = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], Path.cwd()).stdout
    return Path(out.strip())


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, a fresh venv holding it) -- built offline from a copy of the sources (the
    checkout's build/ is left alone), installed non-editable and alone (torch reached through a
    .pth line to this venv's site-packages)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheels = tmp / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
          "-w", wheels, source], tmp)
    (wheel,) = wheels.glob("spe-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp)
    (_purelib(venv / "bin" / "python") / "deps.pth").write_text(f"{_purelib(Path(sys.executable))}\n")
    # --ignore-installed: pip sees this checkout's editable spe through the .pth line and must not touch it
    _run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--no-deps", "--no-index",
          "--ignore-installed", "--quiet", wheel], tmp)
    return wheel, venv


@pytest.mark.slow
def test_the_wheel_ships_every_file_of_the_package(wheel_venv):
    """Every file under src/spe (configs, plans, presets and code) is in the wheel."""
    wheel, _ = wheel_venv
    shipped = set(zipfile.ZipFile(wheel).namelist())
    package = ROOT / "src" / "spe"
    expected = {f"spe/{p.relative_to(package).as_posix()}" for p in package.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
    assert any(name.startswith("spe/lab/synth/configs/") for name in expected)
    assert sorted(expected - shipped) == []


# spe's --help and every command's, in one process of the installed package (a process costs
# seconds of imports); the commands are those spe's own --help lists.
_HELPS = """import contextlib, io, json, re
import spe
from spe.lab.cli.main import main

def help_of(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([*argv, "--help"])
        except SystemExit as exit:
            assert exit.code in (0, None), (argv, exit.code)
    return out.getvalue()

usage = help_of([])
commands = re.search(r"\\{([\\w,-]+)\\}", usage)[1].split(",")
print(json.dumps({"file": spe.__file__, "usage": usage, "helps": {c: help_of([c]) for c in commands}}))
"""


@pytest.mark.slow
def test_the_installed_spe_is_the_wheels_and_every_command_prints_its_help(wheel_venv):
    _, venv = wheel_venv
    found = json.loads(_run([venv / "bin" / "python", "-c", _HELPS], venv.parent).stdout)
    assert Path(found["file"]).is_relative_to(venv)  # not this checkout's spe
    assert {"train", "lra", "synth", "evaluate", "generate", "report", "bench", "sweep", "demo"} <= set(found["helps"])
    for command, text in found["helps"].items():
        assert text.startswith(f"usage: spe {command}") and "--help" in text, (command, text[:200])


@pytest.mark.slow
def test_spe_synth_trains_from_the_wheel(wheel_venv, tmp_path):
    _, venv = wheel_venv
    _run([venv / "bin" / "spe", "synth", "--task", "flip-flop", "--steps", "2", "--eval-every", "2",
          "--eval-lengths", "64", "--threads", "1", "--no-progress", "--out", tmp_path / "run"], tmp_path)
    assert (tmp_path / "run" / "seed0" / "result.json").is_file()


@pytest.mark.slow
def test_spe_train_trains_from_the_wheel(wheel_venv, tmp_path):
    _, venv = wheel_venv
    clean_midi(tmp_path / "midi")
    _run([venv / "bin" / "spe", "-q", "train", "--data", tmp_path / "midi", "--cache-dir", tmp_path / "cache",
          "--out", tmp_path / "run", "--seq-len", "32", "--batch-size", "2", "--d-model", "16", "--num-layers", "1",
          "--num-heads", "2", "--num-realizations", "4", "--steps", "2", "--warmup-steps", "1", "--eval-every", "2",
          "--threads", "1", "--no-progress"], tmp_path)
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert (tmp_path / "run" / "model.safetensors").is_file()


@pytest.mark.slow
def test_spe_lra_trains_on_the_embedded_listops_from_the_wheel(wheel_venv, tmp_path):
    """The cpu-small preset, cut to 2 steps of a 1-layer d_model 16 model on 64 tokens."""
    _, venv = wheel_venv
    _run([venv / "bin" / "spe", "-q", "lra", "--task", "listops", "--steps", "2", "--eval-every", "2",
          "--batch-size", "4", "--seq-len", "64", "--model-option", "d_model=16", "--model-option", "num_layers=1",
          "--model-option", "d_ff=16", "--num-realizations", "4", "--threads", "1", "--no-progress",
          "--out", tmp_path / "run"], tmp_path)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["seeds"] == [0] and 0 <= results["mean"] <= 100

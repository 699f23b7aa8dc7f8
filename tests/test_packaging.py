"""What the package declares matches what it ships and what its code needs: the licence
pyproject names is the LICENSE file's, and the torch floor covers the newest torch API the
library uses."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

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


def _purelib(python: Path) -> Path:
    import subprocess

    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout
    return Path(out.strip())


@pytest.mark.slow
def test_the_wheel_ships_every_packaged_config_and_spe_synth_runs_from_it(tmp_path):
    """Built offline from a copy of the sources (the checkout's build/ is left alone), the wheel
    holds every file of src/spe/lab/configs; installed alone in a fresh venv (torch reached through
    a .pth line to this venv's site-packages) its ``spe synth`` trains two steps."""
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--quiet", "-w", str(wheels), str(source)], check=True)
    (wheel,) = wheels.glob("spe-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    configs = ROOT / "src" / "spe" / "lab" / "configs"
    expected = {f"spe/lab/configs/{p.relative_to(configs).as_posix()}" for p in configs.rglob("*") if p.is_file()}
    assert any(name.startswith("spe/lab/configs/synth/") for name in expected)
    assert expected - shipped == set()

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    (_purelib(python) / "deps.pth").write_text(f"{_purelib(Path(sys.executable))}\n")
    # --ignore-installed: pip sees this checkout's editable spe through the .pth line and must not touch it
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "--ignore-installed", "--quiet", str(wheel)], check=True)
    where = subprocess.run([str(python), "-c", "import spe; print(spe.__file__)"], cwd=tmp_path, check=True,
                           capture_output=True, text=True).stdout
    assert Path(where.strip()).is_relative_to(venv)
    spe = venv / "bin" / "spe"
    assert "--write-data" in subprocess.run([str(spe), "synth", "--help"], cwd=tmp_path, check=True,
                                            capture_output=True, text=True).stdout
    run = subprocess.run([str(spe), "synth", "--task", "flip-flop", "--steps", "2", "--eval-every", "2",
                          "--eval-lengths", "64", "--threads", "1", "--no-progress", "--out", str(tmp_path / "run")],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "run" / "seed0" / "result.json").is_file()

"""What the package declares matches what it ships and what its code needs: the licence
pyproject names is the LICENSE file's, and the torch floor covers the newest torch API the
library uses."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

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

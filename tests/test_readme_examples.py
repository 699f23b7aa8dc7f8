"""Every ```python block of README.md runs as written, each in a fresh namespace, so the
README cannot rot: a renamed function, a changed return type or a wrong shape comment that
an example asserts makes one of these red."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks() -> list[tuple[int, str]]:
    """(line number of the opening fence, code) of each python block."""
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def test_the_readme_has_the_four_python_examples():
    # softmax layer, linear layer, step-by-step decoding, loading and generating
    assert len(_blocks()) >= 4


@pytest.mark.parametrize("line, code", _blocks(), ids=[f"README.md:{line}" for line, _ in _blocks()])
def test_readme_python_block_runs_as_written(line, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything an example writes stays in the test's folder
    exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__readme__"})

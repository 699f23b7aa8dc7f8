"""Docs and sources state facts, not the history of how they were made: no page, docstring,
comment or config speaks of loans of a machine, sessions, "the issue", numbered rounds of work,
status diaries or commit hashes told as a story."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (what the words speak of, pattern); case-insensitive, whole words only
BANNED = [
    ("a loan of a machine", r"\b(?:loans?|lent)\b"),
    ("a working session", r"\bsessions?\b"),
    ("an issue the reader cannot see", r"\bthe issue(?:'s)?\b"),
    ("a numbered or dated round of work", r"\bround \d+\b|\b(?:this|that|next|previous|earlier|later) round\b"
                                          r"|\bengine-\d+ rounds?\b"),
    ("a status diary", r"\*\*status:|^status:"),
    ("a commit hash as narrative", r"\bcommit [0-9a-f]{7,40}\b|\bgit show [0-9a-f]{7,40}\b"),
]
_BANNED = re.compile("|".join(f"(?:{pattern})" for _, pattern in BANNED), re.IGNORECASE | re.MULTILINE)

# Technical uses of a banned word, removed from a line before it is checked (a small, explicit list).
TECHNICAL = [
    r"\b(?:dist_?\.|def )session\(",   # spe.lab.engine.distributed.session: a process group's context
    r"\"session\"",                    # ... and its name in that module's __all__
    r"\bcommit [0-9a-f]{7,40} of [\w.-]+/[\w.-]+",  # a pinned version of an external source
]
_TECHNICAL = re.compile("|".join(TECHNICAL), re.IGNORECASE)

def _files() -> list[Path]:
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "src").rglob("*.py"),
             *(ROOT / "src").rglob("*.toml"), *(ROOT / "tools").rglob("*.py"), *(ROOT / "tools").rglob("*.md"),
             *(ROOT / "scripts").glob("*.sh")]
    return sorted(p for p in files if "egg-info" not in p.parts and p.is_file())


def process_words(text: str) -> list[tuple[int, str]]:
    """(line number, matched words) of every banned phrase of ``text``, technical uses left out."""
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in _BANNED.finditer(_TECHNICAL.sub(" ", line)):
            hits.append((number, match.group(0)))
    return hits


@pytest.mark.parametrize("text", [
    "A GPU was lent on 26 November.", "the fifth loan found", "Loans of a device",
    "as the previous session measured", "Sessions ran", "the issue's target", "The issue asks",
    "changes of round 4", "Changes made in this round", "the engine-3 round", "**Status: complete.**",
    "before (commit 969f8cc) and after", "`git show dfad02d:docs/bench.md`",
])
def test_each_process_phrase_is_caught(text):
    assert process_words(text), text


@pytest.mark.parametrize("text", [
    "an excellent, silent, relentless kernel", "with dist_.session(device_type) as ctx:",
    "def session(device_type: str):", '__all__ = ["session", "setup"]', "issues of the format",
    "every (encoding, round) is a fresh process", "--rounds 3", "round(0.299 R + 0.587 G)",
    "commit bc3b101 of fla-org/flash-linear-attention", "a status: line of the log",
])
def test_technical_words_pass(text):
    assert process_words(text) == [], text


def test_no_doc_or_source_speaks_of_its_own_making():
    found = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        found += [f"{rel}:{n}: {words!r}" for n, words in process_words(path.read_text(encoding="utf-8"))]
    assert not found, "state the fact (what, on which hardware, with which command, on which date):\n" + "\n".join(found)


def test_the_scan_reads_every_kind_of_file():
    kinds = {p.relative_to(ROOT).parts[0] + ":" + p.suffix for p in _files()}
    assert {"README.md:.md", "docs:.md", "src:.py", "src:.toml", "tools:.py", "tools:.md", "scripts:.sh"} <= kinds
    assert any(p.parent.name == "bench" and p.parent.parent.name == "docs" for p in _files())  # subfolders too

"""Replaces the generated block of a Markdown page (shared by tools/docs/bench_doc.py and lra_doc.py)."""

from pathlib import Path


def replace_block(doc: Path, begin: str, end: str, body: str) -> bool:
    """Writes ``body`` between the ``begin`` and ``end`` markers of ``doc``; False (nothing
    written) when the page or a marker is missing."""
    text = doc.read_text() if doc.exists() else ""
    if begin not in text or end not in text:
        return False
    head, rest = text.split(begin, 1)
    doc.write_text(f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}")
    return True

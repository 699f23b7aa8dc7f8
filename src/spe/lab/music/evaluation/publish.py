"""Copying a report folder into the documentation (``docs/results.md``), images beside it."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from spe.checkpoint import atomic_write

__all__ = ["publish_report"]


def publish_report(report_dir: str | os.PathLike, doc: str | os.PathLike, *, preamble: str = "") -> Path:
    """Copies a report into the documentation: ``doc`` (Markdown) and its PNGs beside it.

    Images go to ``DOC_STEM/`` next to ``doc`` with links rewritten; links to generated MIDI
    and audio become plain text (generated music is not committed); absolute checkpoint
    paths are shown relative to the working directory when they lie below it.

    Args:
        report_dir: folder written by :func:`build_report` (holds ``report.md``).
        doc: destination Markdown file, e.g. ``docs/results.md``.
        preamble: Markdown put before the report (how it was produced).

    Returns:
        The path of ``doc``.

    Raises:
        ValueError: if ``report_dir`` holds no ``report.md``.
    """
    src, doc = Path(report_dir), Path(doc)
    if not (src / "report.md").is_file():
        raise ValueError(f"{src} holds no report.md: run `spe report --out {src}` first")
    images = doc.parent / doc.stem
    images.mkdir(parents=True, exist_ok=True)
    text = (src / "report.md").read_text()

    def image(match: re.Match) -> str:
        alt, target = match.group(1), match.group(2)
        name = target.replace("/", "-")
        shutil.copyfile(src / target, images / name)
        return f"![{alt}]({images.name}/{name})"

    text = re.sub(r"!\[([^\]]*)\]\(([^)]+\.png)\)", image, text)
    text = re.sub(r"\[([^\]]+)\]\(([^)]+\.(?:mid|wav))\)", r"`\1` (in the report folder, not committed)", text)
    cwd = str(Path.cwd()) + os.sep
    text = text.replace(cwd, "")
    atomic_write(doc, lambda tmp: Path(tmp).write_text(preamble + text))
    return doc

"""Renders the results tables of docs/lra.md from `spe lra` runs.

Usage: python tools/docs/lra_doc.py [RUNS_FOLDER] [DOC] [STUDY_FOLDER]
(defaults runs/lra/cpu-small, docs/lra.md and runs/lra/listops-study). Replaces the text between
<!-- lra-results:begin --> and <!-- lra-results:end --> in DOC with the tables of RUNS_FOLDER, and
between <!-- lra-study:begin --> and <!-- lra-study:end --> with the ListOps study collected from
STUDY_FOLDER (`spe lra --plan listops-study`), whose loss plot is copied to docs/lra/. A folder
that does not exist leaves its block as it is; without the markers the tables are printed.
"""

import shutil
import sys
from pathlib import Path

from doc_block import replace_block

from spe.lab import plans
from spe.lab.plans import load_plan
from spe.lab.lra.report import results_tables
from spe.lab.lra.study_results import study_markdown

BEGIN, END = "<!-- lra-results:begin -->", "<!-- lra-results:end -->"
STUDY_BEGIN, STUDY_END = "<!-- lra-study:begin -->", "<!-- lra-study:end -->"
STUDY_PLOT = "lra/listops-study-loss.png"  # relative to DOC's folder


def study_block(folder: Path, doc: Path) -> str:
    """The study's tables with the page's heading levels (groups as ###) and its loss plot."""
    collected = plans.collect_results(load_plan("listops-study", "lra"), folder)
    lines = study_markdown(collected).splitlines()[1:]  # the page's section has the title
    text = "\n".join("#" + line if line.startswith("## ") else line for line in lines).strip()
    if (folder / "loss.png").is_file():
        shutil.copyfile(folder / "loss.png", doc.parent / STUDY_PLOT)
        text += f"\n\n![Training loss of every row, mean over seeds]({STUDY_PLOT})"
    return text


def main() -> int:
    runs = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/lra/cpu-small")
    doc = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/lra.md")
    study = Path(sys.argv[3] if len(sys.argv) > 3 else "runs/lra/listops-study")
    for folder, begin, end, render in ((runs, BEGIN, END, lambda: results_tables(runs)),
                                       (study, STUDY_BEGIN, STUDY_END, lambda: study_block(study, doc))):
        if not folder.is_dir():
            print(f"{folder}: no such folder, its block in {doc} is left as it is")
            continue
        body = render()
        if not replace_block(doc, begin, end, body):
            print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

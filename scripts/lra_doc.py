"""Renders the results tables of docs/lra.md from `spe lra` runs.

Usage: python scripts/lra_doc.py [RUNS_FOLDER] [DOC]
(default runs/lra/cpu-small and docs/lra.md). Replaces the text between the markers
<!-- lra-results:begin --> and <!-- lra-results:end --> in DOC; prints the tables otherwise.
"""

import sys
from pathlib import Path

from doc_block import replace_block

from spe.lra.report import results_tables

BEGIN, END = "<!-- lra-results:begin -->", "<!-- lra-results:end -->"


def main() -> int:
    runs = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/lra/cpu-small")
    doc = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/lra.md")
    tables = results_tables(runs)
    if not replace_block(doc, BEGIN, END, tables):
        print(tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())

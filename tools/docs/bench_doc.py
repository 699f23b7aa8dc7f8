"""Renders the results part of docs/bench/cpu.md from one `spe bench` run's JSON.

Usage: python tools/docs/bench_doc.py [BENCH_JSON] [DOC]
(default runs/bench_final/bench.json and docs/bench/cpu.md). Replaces the text between the
markers <!-- bench-results:begin --> and <!-- bench-results:end --> in DOC with the run's
command, the load it ran under and its report (spe.lab.bench.run.bench_markdown); prints it
otherwise.
"""

import json
import statistics
import sys
from pathlib import Path

from doc_block import replace_block

from spe.lab.bench.run import bench_markdown

BEGIN, END = "<!-- bench-results:begin -->", "<!-- bench-results:end -->"


def portable(command: str) -> str:
    """The recorded command with absolute paths shown as a reader would type them: relative to
    the working directory when below it, else from their ``runs/`` folder on (a machine's own
    paths mean nothing on the page)."""
    words = []
    for word in command.split(" "):
        path = Path(word)
        if path.is_absolute():
            if path.is_relative_to(Path.cwd()):
                word = path.relative_to(Path.cwd()).as_posix()
            elif "runs" in path.parts:
                parts = path.parts
                word = "/".join(parts[len(parts) - 1 - parts[::-1].index("runs"):])
        words.append(word)
    return " ".join(words)


def header(payload: dict) -> str:
    loads = [r["load_1min"] for r in payload["records"] + (payload.get("model_rounds") or []) if "load_1min" in r]
    load = (f"1-minute load average when each case started: median {statistics.median(loads):.2f}, "
            f"range {min(loads):.2f}-{max(loads):.2f} over {len(loads)} cases"
            if loads else "load not recorded")
    return "\n".join(["```bash", portable(payload.get("command", "(command not recorded)")), "```", "",
                      f"float32 matmul rate at the end of the run: {payload['matmul_gflops']:.0f} GFLOP/s; {load}.",
                      ""])


def main() -> int:
    run = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/bench_final/bench.json")
    doc = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/bench/cpu.md")
    payload = json.loads(run.read_text())
    body = header(payload) + "\n" + bench_markdown(payload)
    if not replace_block(doc, BEGIN, END, body):
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

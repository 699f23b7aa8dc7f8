"""Writes the Palestrina part of docs/gates.md from the `gates-palestrina` sweep.

Run after the sweep named in the page::

    .venv/bin/python tools/docs/gates_doc.py [--runs runs/gates] [--doc docs/gates.md]

The Bach chorales' table is the committed study ``docs/data/gates-bach.*`` (its block
``<!-- table:gates-bach -->``, written by ``tools/docs/study_tables.py``); Palestrina's runs of
25-26 Nov 2026 recorded no provenance and kept no per-seed data, so its table stays this script's
until they are rerun into a study of their own. From ``--runs``/palestrina/results.json: per
variant the mean ± sample std (n − 1) over seeds of the test pieces' cross-entropy in [0, L),
[3L, 4L) and [15L, 16L), the growth from the first to the last bucket, the best groups (within
one standard deviation of the best mean) in the first and last buckets, and a plot of
cross-entropy against position on a log axis (``docs/gates/palestrina.png``). The prose around
the block is a person's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from doc_block import replace_block
from peers_doc import best_group, plot

from spe.lab.music.plan import summarize_runs
from spe.lab.plans import load_plan
from spe.lab.stats import SEED_SPREAD, format_mean_std

BEGIN, END = "<!-- gates:begin (tools/docs/gates_doc.py) -->", "<!-- gates:end -->"
CORPORA = {"palestrina": ("gates-palestrina", "Palestrina (every 2nd score), L = 256, 30 held-out scores of "
                          "≥ 4,097 tokens", "--data music21:palestrina/2")}
SHOWN = (0, 3, 15)  # buckets [0, L), [3L, 4L), [15L, 16L)


def _cell(mean: float, std: float) -> str:
    return format_mean_std(mean, std, digits=3)


def table(rows: list[dict]) -> list[str]:
    edges = rows[0]["bucket_edges"]
    shown = [b for b in SHOWN if b < len(edges)]
    lines = ["| variant | seeds | " + " | ".join(f"[{edges[b][0]},{edges[b][1]})" for b in shown)
             + " | growth [0,L) → last | train s | description |",
             "|---|---|" + "---|" * len(shown) + "---|---|---|"]
    for r in sorted(rows, key=lambda r: r["buckets"][len(r["buckets"]) - 1][0]):
        g, gs = r["growth"]
        growth = format_mean_std(100 * g, 100 * gs, digits=1, signed=True) + " %"
        t = "" if r["train_s"] is None else f"{r['train_s']:.0f}"
        cells = " | ".join(_cell(*r["buckets"][b]) if b < len(r["buckets"]) else "–" for b in shown)
        lines.append(f"| {r['variant']} | {len(r['seeds'])} | {cells} | {growth} | {t} | {r['description']} |")
    return lines


def corpus_section(key: str, doc: dict, png: Path, link: str) -> list[str]:
    plan_name, title, data = CORPORA[key]
    rows = summarize_runs(doc, load_plan(plan_name, "music"))
    seeds = sorted({s for r in rows for s in r["seeds"]})
    lines = [f"### {title}", "", "```bash",
             f"spe sweep --plan {plan_name} --out runs/gates/{key} {data}".strip(), "```", "",
             f"Cross-entropy of the held-out test pieces (nats/token), {SEED_SPREAD}; growth = last bucket / first bucket − 1 per seed, then averaged; sorted by the last "
             "bucket.", "", *table(rows), ""]
    last = len(rows[0]["buckets"]) - 1
    for bucket, label in ((0, "within the trained range [0, L)"), (last, "at 16× the training length")):
        group, note = best_group(rows, bucket)
        lines.append(f"* Best group {label}: {', '.join(group)} ({note}).")
    plot(rows, png, f"{title}: seeds {','.join(map(str, seeds))}", log_x=True)
    return [*lines, "", f"![cross-entropy by position, {key}]({link})", ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs/gates")
    parser.add_argument("--doc", default="docs/gates.md")
    args = parser.parse_args()
    doc_path, body = Path(args.doc), []
    for key in CORPORA:
        results = Path(args.runs) / key / "results.json"
        if results.exists():
            body += corpus_section(key, json.loads(results.read_text()), doc_path.parent / "gates" / f"{key}.png",
                                   f"gates/{key}.png")
    if not body:
        raise SystemExit(f"no results.json under {args.runs}/{{{','.join(CORPORA)}}}")
    if not replace_block(doc_path, BEGIN, END, "\n".join(body).rstrip()):
        raise SystemExit(f"{doc_path} lacks the markers {BEGIN} … {END}")
    print(f"wrote {doc_path}")


if __name__ == "__main__":
    main()

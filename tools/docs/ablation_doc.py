"""Writes docs/ablation.md from the ablation sweeps' results.json files.

Run after the sweeps listed in the page (see ``COMMANDS``)::

    .venv/bin/python tools/docs/ablation_doc.py [--runs runs] [--out docs/ablation.md]

Tables come from ``spe sweep``'s own summary (spe.lab.music.plan.results_table); the final
comparison pairs every variant with APE seed by seed. The findings that open the page are
``tools/docs/ablation_analysis.md``, written by a person after reading the tables.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spe.lab.music.plan import results_table
from spe.lab.plans import load_plan
from spe.lab.stats import SEED_SPREAD, format_mean_std, mean_and_std

CORPORA = {
    "bach": {
        "title": "Bach chorales (music21), the default corpus",
        "short": "Bach chorales",
        "dirs": ["ablation", "ablation-eval"],
        "commands": [
            "spe sweep --plan ablation --out runs/ablation --seeds 0",
            "spe sweep --plan ablation --out runs/ablation --seeds 1,2 --only "
            "ape,sinespe-ungated,sinespe-ungated-w256,sinespe-ungated-w128,ape-w256,sinespe-ungated-trained-w128",
        ],
    },
    "palestrina": {
        "title": "Second corpus: Palestrina (music21, every 4th of the 1,318 scores)",
        "short": "Palestrina (every 4th score)",
        "note": "330 pieces, 779 k REMI tokens (median 2,022 per piece), 314 training and 16 validation "
                "pieces, 14 of which are long enough for the 768 evaluated positions.",
        "dirs": ["ablation-palestrina", "ablation-palestrina-eval"],
        "commands": [
            "spe sweep --plan ablation --out runs/ablation-palestrina --data music21:palestrina/4 --seeds 0,1,2 "
            "--only ape,sinespe-ungated,sinespe-ungated-w256,sinespe-ungated-w128,ape-w256",
            "spe sweep --plan ablation --out runs/ablation-palestrina --data music21:palestrina/4 --seeds 0 "
            "--only sinespe,sinespe-w256",
        ],
    },
}

# (variant, label) rows of the final comparison
FINAL = [("ape", "APE (sinusoidal), whole past"),
         ("sinespe-ungated", "ungated sineSPE, whole past"),
         ("sinespe-ungated-w256", "ungated sineSPE, window 256 = training length (**the default**)"),
         ("sinespe-ungated-w128", "ungated sineSPE, window 128 at test time only"),
         ("sinespe-ungated-trained-w128", "ungated sineSPE, window 128 in training and test"),
         ("ape-trained-w128", "APE, window 128 in training and test")]


def merged(runs_dir: Path, dirs: list[str]) -> dict:
    doc: dict = {}
    for name in dirs:
        path = runs_dir / name / "results.json"
        if path.exists():
            part = json.loads(path.read_text())
            runs = {**part.get("runs", {}), **doc.get("runs", {})}  # the training folder's records win
            doc = {**part, **doc, "runs": runs}
    return doc


def _fmt(values: list[float], pct: bool = False) -> str:
    """``m ± s`` over seeds (spe.lab.stats); ``pct``: a relative change, signed, in %."""
    if not values:
        return "–"
    mean, std = mean_and_std(values)
    if pct:
        return format_mean_std(100 * mean, 100 * std, digits=1, signed=True) + " %"
    return format_mean_std(mean, std, digits=3)


def final_comparison(doc: dict) -> list[str]:
    by = {}
    for r in doc.get("runs", {}).values():
        by.setdefault(r["variant"], {})[r["seed"]] = [b["ce"] for b in r["buckets"]]
    ape = by.get("ape", {})
    lines = ["| model | seeds | [0,256) | [256,512) | [512,768) | [0,256) vs APE, same seed | growth [512,768) / [0,256) |",
             "|---|---|---|---|---|---|---|"]
    for variant, label in FINAL:
        runs = by.get(variant, {})
        if not runs:
            continue
        seeds = sorted(runs)
        cells = [_fmt([runs[s][i] for s in seeds]) for i in range(3)]
        vs = [runs[s][0] / ape[s][0] - 1 for s in seeds if s in ape]
        growth = [runs[s][2] / runs[s][0] - 1 for s in seeds]
        lines.append(f"| {label} | {','.join(map(str, seeds))} | {' | '.join(cells)} | "
                     f"{_fmt(vs, pct=True) if variant != 'ape' else '0'} | {_fmt(growth, pct=True)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs")
    parser.add_argument("--out", default="docs/ablation.md")
    args = parser.parse_args()
    here = Path(__file__).parent
    plan = load_plan("ablation", "music")
    # the findings open the page: title, then the hand-written analysis, then protocol and tables
    title, _, intro = (here / "ablation_intro.md").read_text().rstrip().partition("\n")
    out = [title, "", (here / "ablation_analysis.md").read_text().rstrip(), "", intro.strip(), ""]
    finals = []
    for key, corpus in CORPORA.items():
        doc = merged(Path(args.runs), corpus["dirs"])
        if not doc:
            continue
        finals += [f"**{corpus['short']}**", "", *final_comparison(doc), ""]
        out += [f"## {corpus['title']}", "", *([corpus["note"], ""] if "note" in corpus else []), "```bash", *corpus["commands"], "```", "", *results_table(doc, plan), ""]
    out[6:6] = ["## Final comparison", "",
                f"Nats/token, {SEED_SPREAD}. Targets: [0,256) within 5 % of APE; "
                "[512,768) at most 10 % above the model's own [0,256). "
                "The test-time windows re-evaluate the checkpoints of the row above them.", "", *finals]
    Path(args.out).write_text("\n".join(out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

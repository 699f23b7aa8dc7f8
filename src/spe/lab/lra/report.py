"""Results tables of ``spe lra`` experiments beside the paper's Table 1 and LRA's baselines."""

from __future__ import annotations

import json
from pathlib import Path

from spe.lab.plans import Column, markdown_table
from spe.lab.stats import SEED_SPREAD, format_mean_std, mean_and_std

__all__ = ["LRA_BASELINES", "PAPER_TABLE1", "collect_results", "results_tables"]

TASK_TITLES = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image"}
# Liutkus et al. (2021), Table 1: test accuracy (%) on LRA, mean ± std where the paper gives one,
# as printed there (the paper's own spread, not converted to spe.lab.stats' convention).
# Keys: (attention, encoding family); Image used learned APE and the 2-D convSPE.
PAPER_TABLE1 = {
    ("performer", "ape"): {"listops": "17.80 ± 0.00", "text": "62.58 ± 0.22", "retrieval": "59.84 ± 1.46",
                           "image": "41.81 ± 1.16"},
    ("performer", "sinespe"): {"listops": "17.43 ± 0.32", "text": "62.60 ± 0.50", "retrieval": "60.00 ± 1.20",
                               "image": "41.12 ± 1.70"},
    ("performer", "convspe"): {"listops": "17.80", "text": "60.94", "retrieval": "57.22", "image": "40.06"},
    ("linear-relu", "ape"): {"listops": "17.58 ± 1.01", "text": "63.98 ± 0.05", "retrieval": "58.78 ± 0.93",
                             "image": "42.25 ± 0.01"},
    ("linear-relu", "sinespe"): {"listops": "17.80 ± 0.00", "text": "64.09 ± 0.62", "retrieval": "62.39 ± 0.59",
                                 "image": "41.21 ± 1.18"},
    ("linear-relu", "convspe"): {"listops": "9.50 ± 1.17", "text": "63.23 ± 1.31", "retrieval": "61.00 ± 1.34",
                                 "image": "39.96 ± 1.31"},
}
# Tay et al. (2021), LRA's own baselines (test accuracy, %), for scale.
LRA_BASELINES = {"Transformer": {"listops": "36.37"},
                 "Performer": {"listops": "18.01", "text": "65.40", "retrieval": "53.82", "image": "42.77"},
                 "Linear Transformer": {"listops": "16.13", "text": "65.90", "retrieval": "53.09", "image": "42.34"}}
_FAMILY = {"ape-learned": "ape", "convspe-2d": "convspe"}
_ATTENTION_ORDER = ("performer", "linear-relu")
_POSITIONAL_ORDER = ("ape", "ape-learned", "sinespe", "convspe", "convspe-2d")


def collect_results(folder: str | Path) -> list[dict]:
    """Every ``results.json`` under ``folder`` (one per experiment), in the paper's order of tasks,
    kernels and encodings."""
    found = [json.loads(p.read_text()) for p in sorted(Path(folder).rglob("results.json"))]

    def rank(values: tuple, value: str) -> tuple:  # the paper's order, others after it by name
        return (values.index(value), "") if value in values else (len(values), value)

    return sorted(found, key=lambda r: (rank(tuple(TASK_TITLES), r["config"]["task"]),
                                        rank(_ATTENTION_ORDER, r["config"]["attention"]),
                                        rank(_POSITIONAL_ORDER, r["config"]["positional"])))


def _paper(summary: dict) -> str:
    cfg = summary["config"]
    return PAPER_TABLE1.get((cfg["attention"], _FAMILY.get(cfg["positional"], cfg["positional"])), {}).get(
        cfg["task"], "–")


# recomputed from the per-seed accuracies: a results.json written with the population std
# (before spe.lab.stats) renders with the sample std like a new one
_COLUMNS = [Column("kernel", cell=lambda s: s["config"]["attention"]),
            Column("encoding", cell=lambda s: s["config"]["positional"]),
            Column("test accuracy (%)", cell=lambda s: f"**{format_mean_std(*mean_and_std(s['test_accuracy']))}**"),
            Column("seeds", cell=lambda s: str(len(s["results"]))),
            Column("per seed", cell=lambda s: ", ".join(f"{a:.1f}" for a in s["test_accuracy"])),
            Column("best step / steps", cell=lambda s: ", ".join(str(r["best_step"]) for r in s["results"])
                   + f" / {s['config']['steps']}"),
            Column("minutes per run",
                   cell=lambda s: f"{sum(r['seconds'] for r in s['results']) / 60 / len(s['results']):.1f}"),
            Column("paper, Table 1", cell=_paper)]


def results_tables(folder: str | Path) -> str:
    """Markdown: one table per task of the experiments found under ``folder``.

    Columns: kernel, encoding, test accuracy (:data:`~spe.lab.stats.SEED_SPREAD`), seeds,
    per-seed accuracies, best validation step / steps, minutes per run, and the paper's
    Table 1 value for the same kernel and encoding (a different scale and, except ListOps,
    different data: see docs/lra.md).
    """
    results = collect_results(folder)
    parts = [f"Test accuracy (%) of each seed's best validation checkpoint, {SEED_SPREAD}. "
             "The paper's column is as printed in its Table 1.", ""]
    for task, title in TASK_TITLES.items():
        rows = [r for r in results if r["config"]["task"] == task]
        if not rows:
            continue
        baselines = ", ".join(f"{name} {v[task]}" for name, v in LRA_BASELINES.items() if task in v)
        parts += [f"### {title}", "", *markdown_table(rows, _COLUMNS), "",
                  f"LRA's own baselines (Tay et al. 2021, full scale): {baselines}.", ""]
    return "\n".join(parts) if len(parts) > 2 else ""

"""The results of an LRA study (:mod:`spe.lab.lra.study`), collected from its row folders.

``OUT/results.json`` (one record per plan row), ``OUT/results.md`` (one table per group) and
``OUT/loss.png`` (the training-loss curves, one panel per group) are rebuilt from what the
row folders hold (``OUT/ROW/seedK/result.json``, :func:`spe.lab.plans.read_results`, and
``metrics.jsonl``), never from a previous ``results.json``: runners sharing ``OUT`` cannot lose
each other's rows, and each file is replaced atomically. A row with no finished seed is reported as not run.

Per row: test accuracy (%) per seed, mean ± sample standard deviation (n − 1; None for one
seed) over the finished seeds (as :func:`spe.lab.lra.run.summarize`), best validation accuracy (%), median seconds per
optimizer step and the mean training-loss curve. Seconds per step are read from the
validation records: (seconds between two records) / (steps between them), median over the
intervals of every finished seed; each interval includes its validation and checkpoint
(about ``eval_examples / (eval_every · batch_size)`` forward passes per step, ~0.1 at
cpu-small), so it overstates the pure training step by a few percent, alike for every row.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import textwrap
from pathlib import Path

from spe.checkpoint import atomic_write
from spe.lab import plans
from spe.lab.lra.run import summarize
from spe.lab.plans import Column, markdown_table
from spe.lab.stats import SEED_SPREAD, format_mean_std, mean_and_std
from spe.lab.engine.core import METRICS_FILE
from spe.lab.engine.metrics_log import read_records

__all__ = ["collect_row", "plot_study_losses", "study_document", "study_markdown"]

log = logging.getLogger(__name__)


def _step_seconds(records: list[dict]) -> list[float]:
    """Seconds per step of each interval between consecutive records (the first from step 0)."""
    times, step, seconds = [], 0, 0.0
    for r in records:
        if r["step"] > step and r.get("seconds") is not None and r["seconds"] > seconds:
            times.append((r["seconds"] - seconds) / (r["step"] - step))
        step, seconds = r["step"], r.get("seconds") or seconds
    return times


def _mean_curve(curves: list[list[tuple[int, float]]]) -> list[list[float]]:
    """[step, mean training loss] at the steps every seed recorded."""
    if not curves:
        return []
    common = set.intersection(*({s for s, _ in c} for c in curves))
    by_step = [dict(c) for c in curves]
    return [[s, statistics.fmean(c[s] for c in by_step)] for s in sorted(common)]


def collect_row(folder: str | Path, name: str, row: dict, planned_seeds: list[int]) -> dict:
    """The record of one study row from its folder (``status`` ``not run`` without a finished seed).

    Args:
        folder: the row's ``spe lra`` experiment folder.
        name: the row's name.
        row: its plan entry (``group``, ``description``, ``positional``, ``attention``, ``options``,
            ``changes``).
        planned_seeds: the plan's seeds (``status`` is ``done`` once all of them are finished).
    """
    runs = plans.read_results(folder)
    record = {"name": name, "group": row["group"], "description": row["description"],
              "positional": row["positional"], "attention": row["attention"], "options": row["options"],
              "changes": row.get("changes", row["options"])}
    if not runs:
        return {**record, "status": "not run", "seeds": [], "test_accuracy": [], "mean": None, "std": None,
                "val_accuracy": [], "best_val_mean": None, "step_seconds": None, "loss_curve": [],
                "seed_loss_curves": {}}
    summary = summarize(list(runs.values()))
    records = {seed: read_records(Path(folder) / f"seed{seed}" / METRICS_FILE) for seed in runs}
    curves = {seed: [(m["step"], m["train_loss"]) for m in rs if m.get("train_loss") is not None]
              for seed, rs in records.items()}
    intervals = [t for rs in records.values() for t in _step_seconds(rs)]
    val = [100 * r["val_accuracy"] for r in runs.values()]
    done = set(planned_seeds) <= set(summary["seeds"])
    return {**record, "status": "done" if done else "partial", "seeds": summary["seeds"],
            "test_accuracy": summary["test_accuracy"], "mean": summary["mean"], "std": summary["std"],
            "val_accuracy": val, "best_val_mean": statistics.fmean(val),
            "step_seconds": statistics.median(intervals) if intervals else None,
            "loss_curve": _mean_curve(list(curves.values())),
            "seed_loss_curves": {str(s): [list(p) for p in c] for s, c in curves.items()}}


def study_document(plan, out: str | Path) -> tuple[dict, str]:
    """Every row of ``plan`` (:class:`~spe.lab.lra.study.StudyPlan`) collected from ``out``: the
    document (``OUT/results.json``) and its Markdown (``OUT/results.md``), one table per group."""
    rows = [collect_row(Path(out) / name, name, row, plan.seeds) for name, row in plan.rows.items()]
    doc = {"title": plan.title, "plan": plan.path, "task": plan.task, "preset": plan.preset, "seeds": plan.seeds,
           "reference": plan.reference, "baseline": plan.baseline, "groups": plan.groups, "rows": rows}
    return doc, study_markdown(doc)


def _options(row: dict) -> str:
    """The row's own options (beside the plan's defaults) as ``key=value``, model options first."""
    options = dict(row["changes"])
    model = options.pop("model", {})
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in [*model.items(), *options.items()]) or "–"


def _columns(ref: dict | None, vs: str) -> list[Column]:
    """The study table's columns; a row that has not run shows ``not run`` and dashes."""

    def ran(cell):
        return lambda r: "–" if r["status"] == "not run" else cell(r)

    def accuracy(r: dict) -> str:  # from the seeds, whatever std an older file stored
        return "not run" if r["status"] == "not run" else f"**{format_mean_std(*mean_and_std(r['test_accuracy']))}**"

    def ratio(r: dict) -> str:
        return (f"{r['step_seconds'] / ref['step_seconds']:.2f}×"
                if ref and r["step_seconds"] and ref.get("step_seconds") else "–")

    return [Column("row", cell=lambda r: r["name"]),
            Column("kernel + encoding", cell=lambda r: f"{r['attention']} + {r['positional']}"),
            Column("options", cell=_options), Column("test accuracy (%)", cell=accuracy),
            Column(f"Δ{vs} (points)", cell=ran(lambda r: f"{r['mean'] - ref['mean']:+.2f}"
                                                if ref and ref.get("mean") is not None else "–")),
            Column("per seed", cell=ran(lambda r: ", ".join(f"{a:.1f}" for a in r["test_accuracy"]))),
            Column("best val (%)", cell=ran(lambda r: f"{r['best_val_mean']:.2f}")),
            Column("s/step", cell=ran(lambda r: "–" if r["step_seconds"] is None else f"{r['step_seconds']:.3f}")),
            Column(f"step time{vs}", cell=ran(ratio)),
            Column("seeds", cell=lambda r: f"{len(r['seeds'])}" + ("" if r["status"] != "partial" else " (partial)"))]


def study_markdown(doc: dict) -> str:
    """Markdown: one table per group of the collected rows (see the module docstring for the columns)."""
    rows = doc["rows"]
    ref = next((r for r in rows if r["name"] == doc.get("reference") and r["status"] != "not run"), None)
    columns = _columns(ref, f" vs {doc['reference']}" if doc.get("reference") else "")
    lines = [f"# {doc['title']}", "",
             f"Task {doc['task']}, preset {doc['preset']}, seeds {doc['seeds']}. Test accuracy of each seed's best "
             f"validation checkpoint, {SEED_SPREAD} (finished seeds only); best val = mean of the "
             "seeds' best validation accuracies; s/step = median seconds per optimizer step (validation "
             "included).", ""]
    for group, title in doc["groups"].items():
        members = [r for r in rows if r["group"] == group]
        if members:
            lines += [f"## {title}", "", *markdown_table(members, columns), ""]
    described = [f"* **{r['name']}**: {r['description']}" for r in rows if r["description"]]
    return "\n".join(lines + (["Rows:", "", *described, ""] if described else []))


def plot_study_losses(doc: dict, path: str | Path) -> Path | None:
    """Training loss (running mean, nats) against steps, mean over seeds, one panel per group; the
    reference (dashed) and the baseline (dotted) rows are drawn in every panel.

    Returns:
        The file written, or None without matplotlib (a warning says so).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("no loss plot: matplotlib is not installed (pip install 'spe[lra]')")
        return None
    groups = [g for g in doc["groups"] if any(r["loss_curve"] for r in doc["rows"] if r["group"] == g)]
    # the reference and the ablations' baseline in every panel, for scale
    marks = [(r, style) for name, style in ((doc.get("reference"), "k--"), (doc.get("baseline"), "k:"))
             for r in doc["rows"] if r["name"] == name and r["loss_curve"]]
    ncols = min(2, len(groups))
    nrows = math.ceil(len(groups) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.8 * nrows), squeeze=False)
    for ax, group in zip(axes.flat, groups):
        members = [r for r in doc["rows"] if r["group"] == group and r["loss_curve"]]
        colors = plt.cm.tab20(range(len(members))) if len(members) > 10 else [None] * len(members)
        for row, color in zip(members, colors):
            ax.plot(*zip(*row["loss_curve"]), label=f"{row['name']} ({len(row['seeds'])})", color=color)
        for row, style in marks:
            if row["group"] != group:
                ax.plot(*zip(*row["loss_curve"]), style, linewidth=1.5, label=f"{row['name']} ({len(row['seeds'])})")
        ax.set_title(textwrap.fill(doc["groups"][group], 70), fontsize=9)
        ax.set(xlabel="step", ylabel="training loss (nats, running mean)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.suptitle(f"{doc['title']}: mean over seeds (seeds in brackets)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path

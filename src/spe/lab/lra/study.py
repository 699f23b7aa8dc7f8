"""Controlled LRA studies: rows of (encoding, kernel, options) × seeds, run resumably into one folder.

A study plan is a TOML file (packaged: ``src/spe/lab/lra/configs/NAME.toml``, e.g. ``listops-study``)::

    title = "..."                       # the results' title
    task = "listops"                    # one task and one preset for every row
    preset = "cpu-small"
    seeds = [0, 1, 2]
    reference = "ape-performer"         # the row others are compared with (accuracy, step time)
    baseline = "sinespe-performer"      # optional: the row the ablations change (drawn in every panel)
    groups = { decomposition = "...", ablation = "..." }   # optional: group titles, in plot order

    [defaults]                          # optional: LRAConfig options of every row
    [defaults.model]                    # optional: model options of every row

    [rows.NAME]
    group = "ablation"
    description = "..."
    positional = "sinespe"
    attention = "performer"
    positional_lr_scale = 10.0          # any LRAConfig option
    model = { gated = false }           # any model option (``spe lra --model-option``)

Later tables win: preset < ``[defaults]`` < row < run options (``--steps``, ``--device`` …).
The plan is read and run by :mod:`spe.lab.plans`: ``OUT/NAME`` is the row's ``spe lra``
experiment folder (``config.json``, ``seedK/``, its own ``results.json``), finished seeds
(``seedK/result.json``) are skipped and interrupted ones resume (:func:`~spe.lab.lra.train_seed`);
after every run ``OUT/results.json``, ``results.md`` and ``loss.png`` are rebuilt from what the
row folders hold (:func:`spe.lab.lra.study_results.collect_study`), atomically, so runners
with disjoint ``only`` lists may share ``OUT`` and a last call collects everything.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from spe.lab import plans
from spe.lab.lra.config import PRESETS, LRAConfig, preset_config
from spe.lab.lra.run import attention_map, load_splits, open_experiment, write_summary
from spe.lab.lra.study_results import collect_study
from spe.lab.lra.train import train_seed
from spe.lab.options import check_threads
from spe.lab.engine import distributed as dist_
from spe.lab.engine.core import TrainingDiverged

__all__ = ["STUDY_FORMAT", "StudyPlan", "load_study", "packaged_studies", "row_config", "run_study"]

log = logging.getLogger(__name__)

_ROW_KEYS_REFUSED = ("task", "preset")  # one task and one preset per study
_SPLIT_KEYS = ("task", "data", "max_length", "listops_pipeline", "data_options")


class StudyPlan(plans.Plan):
    """A study plan (:class:`spe.lab.plans.Plan`, see the module docstring).

    Rows: name -> ``{"group", "description", "positional", "attention", "options", "changes"}``,
    options being the row's :class:`LRAConfig` overrides (``model`` included, ``[defaults]``
    merged in), changes the row's own, in plan order. :attr:`task`, :attr:`preset`,
    :attr:`baseline` (the row that other rows change one thing of, or None: the loss plot draws
    it and the reference in every panel) and :attr:`groups` (group name -> title, in the order
    of the results and the plot's panels) are its settings.
    """

    task = property(lambda self: self.settings["task"])
    preset = property(lambda self: self.settings["preset"])
    baseline = property(lambda self: self.settings["baseline"])
    groups = property(lambda self: self.settings["groups"])


def _settings(top: dict) -> dict:
    if "task" not in top:
        raise ValueError("give task (e.g. task = \"listops\")")
    return {"task": top["task"], "preset": top.get("preset", "cpu-small"), "baseline": top.get("baseline"),
            "groups": dict(top.get("groups", {})), "defaults": top.get("defaults", {})}


def _row(spec: dict, settings: dict) -> dict:
    """One row's parsed table, its configuration checked (without data) by :class:`LRAConfig`."""
    refused = [k for k in _ROW_KEYS_REFUSED if k in spec]
    if refused:
        raise ValueError(f"{', '.join(refused)} is set once for the whole plan, not per row")
    missing = [k for k in ("positional", "attention") if k not in spec]
    if missing:
        raise ValueError(f"give {' and '.join(missing)}")
    row = {"group": str(spec.pop("group", "rows")), "positional": spec.pop("positional"),
           "attention": spec.pop("attention")}
    base, own_model = dict(settings["defaults"]), spec.pop("model", {})
    row["options"] = {**base, **spec, "model": {**base.pop("model", {}), **own_model}}
    row["changes"] = {**({"model": own_model} if own_model else {}), **spec}  # what the row adds to the defaults
    preset_config(settings["task"], row["positional"], row["attention"], preset=settings["preset"], **row["options"])
    return row


def _check_plan(plan: StudyPlan) -> None:
    if plan.baseline is not None and plan.baseline not in plan.rows:
        raise ValueError(f"{plan.where()}: baseline {plan.baseline!r} is not one of its rows")
    for row in plan.rows.values():
        plan.groups.setdefault(row["group"], row["group"])


STUDY_FORMAT = plans.PlanFormat(
    kind="study plan", rows_key="rows", row_word="row", folder="lra/configs", not_plans=PRESETS,
    top_keys=("task", "preset", "baseline", "groups", "defaults"), settings=_settings, row=_row,
    check=_check_plan, plan_class=StudyPlan)


def packaged_studies() -> tuple[str, ...]:
    """Names of the packaged study plans (``src/spe/lab/lra/configs/*.toml`` that are not presets)."""
    return tuple(plans.packaged_plans(STUDY_FORMAT))


def load_study(path_or_name: str) -> StudyPlan:
    """Reads a study plan file, or the name of a packaged one (e.g. ``listops-study``).

    Every row's configuration is built (no data, no model) so that a mistake in the plan is
    reported before anything runs.

    Raises:
        ValueError: naming the file (and the row) on a missing file, invalid TOML, a missing
            or unknown option, or a value :class:`LRAConfig` refuses.
    """
    return plans.load_plan(path_or_name, STUDY_FORMAT)


def row_config(plan: StudyPlan, name: str, **run_options) -> LRAConfig:
    """The :class:`LRAConfig` of row ``name``; ``run_options`` (e.g. ``steps``, ``device``, ``data``)
    win over the plan's, None values change nothing.

    Raises:
        ValueError: on an unknown row, or as :func:`~spe.lab.lra.preset_config`.
    """
    row = plan.rows[plans.select_rows(plan, [name])[0]]
    options = {**row["options"], **{k: v for k, v in run_options.items() if v is not None}}
    return preset_config(plan.task, row["positional"], row["attention"], preset=plan.preset, **options)


def run_study(plan: StudyPlan, out: str | Path, *, only: list[str] | None = None, seeds: list[int] | None = None,
              threads: int | None = None, progress: bool = True, **run_options) -> dict:
    """Runs the rows of ``plan`` (each over every seed, resumably) into ``out/ROW``, collecting after each run.

    Row by row, so that each row folder is a whole ``spe lra`` experiment as soon as it is
    done (run ``seeds=[0]`` first to have every row at one seed early). The splits are loaded
    once for consecutive rows that read the same data. A run whose training diverges is
    reported at the end; the other runs still run.

    Args:
        plan: from :func:`load_study`.
        out: the study folder.
        only: row names to run (default: all); several runners may share ``out`` with disjoint lists.
        seeds: overrides the plan's seeds.
        threads: torch CPU threads (None or 0: torch's default).
        progress: tqdm bars.
        run_options: :class:`LRAConfig` options for every row (``steps``, ``device``, ``data``,
            ``precision`` …; None: the plan's).

    Returns:
        The collected results (``out/results.json``'s content).

    Raises:
        ValueError: on an unknown row, a row folder that holds another configuration, as
            :func:`~spe.lab.lra.train_seed`, or naming the runs that diverged (after the others ran).
    """
    out, seeds = Path(out), list(seeds or plan.seeds)
    configs = {name: row_config(plan, name, **run_options) for name in plans.select_rows(plan, only)}
    check_threads(threads)
    if threads:
        torch.set_num_threads(threads)
    cached: dict = {}

    def splits(cfg: LRAConfig) -> dict:
        key = tuple(str(getattr(cfg, k)) for k in _SPLIT_KEYS)
        if key not in cached:
            cached.clear()  # frees the previous splits before loading others
            cached[key] = load_splits(cfg)
        return cached[key]

    def after(name: str, seed: int, result: dict) -> None:
        if ctx.is_main:
            done = plans.read_results(out / name)
            write_summary(out / name, configs[name], [done[s] for s in seeds if s in done])
            attention_map(out / name, seed, splits(configs[name]), configs[name])
            collect_study(plan, out)

    device = next((str(c.device) for c in configs.values()), "cpu")
    with dist_.session("cuda" if device.startswith("cuda") else "cpu") as ctx:
        # --out itself first: a foreign folder is refused before any row folder is made in it
        plans.claim_folder(out, plan.format.kind if plan.format else "plan", ctx=ctx)
        for name, cfg in configs.items():  # a folder holding another experiment is refused before any run
            open_experiment(out / name, cfg, ctx)
        try:
            plans.run_plan(plan, out, lambda name, seed, folder: train_seed(configs[name], splits(configs[name]), seed,
                                                                            folder, progress=progress),
                           rows=list(configs), seeds=seeds, by_seed=False, after=after, ctx=ctx,
                           failures=(TrainingDiverged,),
                           config=lambda name, seed: {**configs[name].to_dict(), "seed": seed})
        except plans.RunsFailed:
            collect_study(plan, out)
            raise
    return collect_study(plan, out)

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
row folders hold (:meth:`LRAPlans.results`), atomically, so runners
with disjoint ``only`` lists may share ``OUT`` and a last call collects everything.
"""

from __future__ import annotations

import logging
from pathlib import Path


from spe.lab import plans
from spe.lab.lra.config import PRESETS, LRAConfig, preset_config
from spe.lab.lra.run import attention_map, load_splits, open_experiment, write_summary
from spe.lab.lra.study_results import plot_study_losses, study_document
from spe.lab.lra.train import train_seed
from spe.lab.engine import distributed as dist_

__all__ = ["STUDY_FORMAT", "LRAPlans", "StudyPlan", "row_config"]

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
    check=_check_plan, plan_class=StudyPlan, task="lra")


def row_config(plan: StudyPlan, name: str, **run_options) -> LRAConfig:
    """The :class:`LRAConfig` of row ``name``; ``run_options`` (e.g. ``steps``, ``device``, ``data``)
    win over the plan's, None values change nothing.

    Raises:
        ValueError: on an unknown row, or as :func:`~spe.lab.lra.preset_config`.
    """
    row = plan.rows[plans.select_rows(plan, [name])[0]]
    options = {**row["options"], **{k: v for k, v in run_options.items() if v is not None}}
    return preset_config(plan.task, row["positional"], row["attention"], preset=plan.preset, **options)


class LRAPlans(plans.PlanTask):
    """The LRA study plans (``spe lra --plan``, :mod:`spe.lab.plans`): row by row, so that each row
    folder is a whole ``spe lra`` experiment as soon as it is done (run ``seeds=[0]`` first to have
    every row at one seed early); the splits are loaded once for consecutive rows that read the same
    data; under ``torchrun`` each run's batch is shared between the processes and rank 0 writes.

    Run options: :class:`LRAConfig` options for every row (``steps``, ``device``, ``data``,
    ``precision``, ``keep_checkpoints``, ``tensorboard``, ``compile``; None: the plan's)."""

    name = "lra"
    format = STUDY_FORMAT
    by_seed = False
    run_options = ("data", "steps", "device", "precision", "keep_checkpoints", "tensorboard", "compile")
    figures = ("loss.png",)

    def __init__(self, plan: StudyPlan, out, **kwargs):
        super().__init__(plan, out, **kwargs)
        self.configs = {name: row_config(plan, name, **self.options) for name in self.names}
        self._splits: dict = {}

    @classmethod
    def default_out(cls, plan: StudyPlan) -> Path:
        return Path("runs/lra") / plan.preset / Path(plan.path).stem

    def processes(self):
        device = next((str(c.device) for c in self.configs.values()), "cpu")
        return dist_.session("cuda" if device.startswith("cuda") else "cpu")

    def splits(self, cfg: LRAConfig) -> dict:
        key = tuple(str(getattr(cfg, k)) for k in _SPLIT_KEYS)
        if key not in self._splits:
            self._splits.clear()  # frees the previous splits before loading others
            self._splits[key] = load_splits(cfg)
        return self._splits[key]

    def open(self, ctx) -> None:
        for name, cfg in self.configs.items():  # a folder holding another experiment is refused before any run
            open_experiment(self.out / name, cfg, ctx)

    def config(self, name: str, seed: int) -> dict:
        return {**self.configs[name].to_dict(), "seed": seed}

    def run(self, name: str, seed: int, folder: Path) -> dict:
        cfg = self.configs[name]
        return train_seed(cfg, self.splits(cfg), seed, folder, progress=self.progress)

    def after(self, name: str, seed: int, result: dict, ctx) -> None:
        if ctx.is_main:
            done = plans.read_results(self.out / name)
            write_summary(self.out / name, self.configs[name], [done[s] for s in self.seeds if s in done])
            attention_map(self.out / name, seed, self.splits(self.configs[name]), self.configs[name])

    def results(self) -> tuple[dict, str]:
        return study_document(self.plan, self.out)

    def written(self, doc: dict) -> None:
        if any(r["loss_curve"] for r in doc["rows"]):
            plot_study_losses(doc, self.out / "loss.png")

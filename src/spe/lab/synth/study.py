"""Synthetic-task studies: rows of model options × seeds, run resumably into one folder (``spe synth --plan``).

A plan is a TOML file read by :mod:`spe.lab.plans` (packaged: ``src/spe/lab/synth/configs/NAME.toml``,
e.g. ``learned-time-flip-flop``)::

    title = "..."
    task = "flip-flop"                  # one task per plan
    seeds = [0, 1, 2]
    reference = "ape"                   # optional

    [defaults]                          # optional: SynthConfig options of every row
    [defaults.model]                    # optional: model options of every row

    [rows.NAME]
    description = "..."
    model = { positional = "sinespe", decay = "gated", attention_window = 0 }
    steps = 4000                        # any SynthConfig option

Later tables win: the preset (``cpu-small``) < ``[defaults]`` < row < run options (``--steps``,
``--device``). ``OUT/NAME`` is the row's ``spe synth`` experiment folder (``config.json``,
``seedK/``, its own ``results.json``); finished seeds are skipped (or only tested at the lengths a
grown ``eval_lengths`` adds) and interrupted ones resume;
after every run ``OUT/results.json`` and ``OUT/results.md`` are rebuilt from the row folders,
so runners with disjoint ``--only`` lists may share ``OUT``.
"""

from __future__ import annotations

from pathlib import Path

from spe.lab import plans
from spe.lab.synth.config import PRESETS, SynthConfig, preset_config
from spe.lab.synth.run import missing_lengths, open_experiment, results_markdown, summarize, train_seed, write_summary
from spe.lab.experiment import quiet_defaults

__all__ = ["SYNTH_FORMAT", "SynthPlans", "row_config"]


def _settings(top: dict) -> dict:
    if "task" not in top:
        raise ValueError("give task (flip-flop or mqar)")
    defaults = plans.option_table(top.get("defaults", {}), "defaults")
    plans.option_table(defaults.get("model", {}), "model of [defaults]")
    return {"task": top["task"], "defaults": defaults}


def _row(spec: dict, settings: dict) -> dict:
    """A row's options (``[defaults]`` merged in), checked by building its :class:`SynthConfig`."""
    if "task" in spec:
        raise ValueError("task is set once for the whole plan, not per row")
    base, own_model = dict(settings["defaults"]), plans.option_table(spec.pop("model", {}), "model")
    options = {**base, **spec, "model": {**base.pop("model", {}), **own_model}}
    preset_config(settings["task"], **options)
    return {"options": options}


SYNTH_FORMAT = plans.PlanFormat(kind="synth plan", rows_key="rows", row_word="row", folder="synth/configs",
                                not_plans=PRESETS, top_keys=("task", "defaults"), settings=_settings, row=_row,
                                task="synth")


def row_config(plan: plans.Plan, name: str, **run_options) -> SynthConfig:
    """The :class:`SynthConfig` of row ``name``; ``run_options`` (None: the plan's) win."""
    options = {**plan.rows[plans.select_rows(plan, [name])[0]]["options"],
               **{k: v for k, v in run_options.items() if v is not None}}
    return preset_config(plan.settings["task"], **options)


class SynthPlans(plans.PlanTask):
    """The synthetic tasks' plans (``spe synth --plan``, :mod:`spe.lab.plans`): seed by seed (every
    row at the first seed early); a seed whose result lacks a test length the row now asks for is
    tested again, not trained. Run options (``steps``, ``device``, ``precision``; None: the
    plan's) go to every row."""

    name = "synth"
    format = SYNTH_FORMAT
    run_options = ("steps", "device", "precision")

    def __init__(self, plan: plans.Plan, out, **kwargs):
        super().__init__(plan, out, **kwargs)
        self.configs = {name: row_config(plan, name, **self.options) for name in self.names}

    def open(self, ctx) -> None:
        for name, cfg in self.configs.items():  # a folder holding another experiment is refused before any run
            open_experiment(self.out / name, cfg)

    def config(self, name: str, seed: int) -> dict:
        return {**self.configs[name].to_dict(), "seed": seed}

    def run(self, name: str, seed: int, folder: Path) -> dict:
        return train_seed(self.configs[name], seed, folder, progress=self.progress)

    def current(self, name: str, seed: int, stored: dict) -> bool:
        return not missing_lengths(self.configs[name], stored)

    def after(self, name: str, seed: int, result: dict, ctx) -> None:
        write_summary(self.out / name, self.configs[name])

    def results(self) -> tuple[dict, str]:
        """Row -> description, options, per-seed results and summary; one table per test distribution."""
        found = plans.collect(self.plan, self.out)
        with quiet_defaults():  # the rows this call does not run are only summarised
            rows = {name: (self.configs.get(name) or row_config(self.plan, name), list(found[name].values()))
                    for name in self.plan.rows}
        record = {"title": self.plan.title, "task": self.plan.settings["task"], "rows": {
            name: {"description": self.plan.rows[name]["description"], "options": self.plan.rows[name]["options"],
                   "results": results, "accuracy": summarize(cfg, results)} for name, (cfg, results) in rows.items()}}
        return record, results_markdown(self.plan.title, rows)

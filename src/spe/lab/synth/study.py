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

from spe.checkpoint import atomic_write
from spe.lab import plans, strict_json
from spe.lab.options import set_threads
from spe.lab.synth.config import PRESETS, SynthConfig, preset_config
from spe.lab.synth.run import missing_lengths, open_experiment, results_markdown, summarize, train_seed, write_summary
from spe.lab.music.config import quiet_defaults
from spe.lab.engine.core import TrainingDiverged

__all__ = ["SYNTH_FORMAT", "collect_synth", "load_synth_plan", "packaged_synth_plans", "row_config", "run_synth_plan"]


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
                                not_plans=PRESETS, top_keys=("task", "defaults"), settings=_settings, row=_row)


def packaged_synth_plans() -> tuple[str, ...]:
    """Names of the packaged plans (``src/spe/lab/synth/configs/*.toml`` that are not presets)."""
    return tuple(plans.packaged_plans(SYNTH_FORMAT))


def load_synth_plan(path_or_name: str) -> plans.Plan:
    """Reads a plan file, or the name of a packaged one, checking every row's configuration.

    Raises:
        ValueError: naming the file (and the row), as :func:`spe.lab.plans.load_plan`.
    """
    return plans.load_plan(path_or_name, SYNTH_FORMAT)


def row_config(plan: plans.Plan, name: str, **run_options) -> SynthConfig:
    """The :class:`SynthConfig` of row ``name``; ``run_options`` (None: the plan's) win."""
    options = {**plan.rows[plans.select_rows(plan, [name])[0]]["options"],
               **{k: v for k, v in run_options.items() if v is not None}}
    return preset_config(plan.settings["task"], **options)


def collect_synth(plan: plans.Plan, out: str | Path, configs: dict[str, SynthConfig]) -> dict:
    """Writes ``out/results.json`` (row -> description, options, per-seed results, summary) and
    ``out/results.md`` from the row folders' finished seeds; returns the JSON's content."""
    out = Path(out)
    with plans.results_lock(out):
        found = plans.collect(plan, out)
        with quiet_defaults():  # the rows this call does not run are only summarised
            rows = {name: (configs.get(name) or row_config(plan, name), list(found[name].values()))
                    for name in plan.rows}
        record = {"title": plan.title, "task": plan.settings["task"], "rows": {
            name: {"description": plan.rows[name]["description"], "options": plan.rows[name]["options"],
                   "results": results, "accuracy": summarize(cfg, results)} for name, (cfg, results) in rows.items()}}
        atomic_write(out / "results.json", lambda tmp: Path(tmp).write_text(strict_json.dumps(record, indent=2)))
        atomic_write(out / "results.md", lambda tmp: Path(tmp).write_text(results_markdown(plan.title, rows)))
    return record


def run_synth_plan(plan: plans.Plan, out: str | Path, *, only: list[str] | None = None,
                   seeds: list[int] | None = None, threads: int | None = None, progress: bool = True,
                   **run_options) -> dict:
    """Runs the rows of ``plan`` (every seed, resumably) into ``out/ROW``, seed by seed (every
    row at the first seed early), collecting after each run; a diverged run is reported at the
    end, the others still run.

    Raises:
        ValueError: on an unknown row, a row folder holding another configuration, or naming
            the runs that diverged.
    """
    out = Path(out)
    configs = {name: row_config(plan, name, **run_options) for name in plans.select_rows(plan, only)}
    set_threads(threads)
    plans.claim_folder(out, SYNTH_FORMAT.kind)
    for name, cfg in configs.items():  # a folder holding another experiment is refused before any run
        open_experiment(out / name, cfg)

    def after(name: str, seed: int, result: dict) -> None:
        write_summary(out / name, configs[name])
        collect_synth(plan, out, configs)

    try:
        plans.run_plan(plan, out, lambda name, seed, folder: train_seed(configs[name], seed, folder, progress=progress),
                       rows=list(configs), seeds=seeds, by_seed=True, after=after, failures=(TrainingDiverged,),
                       current=lambda name, seed, stored: not missing_lengths(configs[name], stored),
                       config=lambda name, seed: {**configs[name].to_dict(), "seed": seed})
    finally:
        record = collect_synth(plan, out, configs)
    return record

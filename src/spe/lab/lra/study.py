"""Controlled LRA studies: rows of (encoding, kernel, options) × seeds, run resumably into one folder.

A study plan is a TOML file (packaged: ``src/spe/lab/configs/lra/NAME.toml``, e.g. ``listops-study``)::

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
``OUT/NAME`` is the row's ``spe lra`` experiment folder (``config.json``, ``seedK/``, its own
``results.json``), so finished seeds are skipped and interrupted ones resume (:func:`run_lra`);
after every row ``OUT/results.json``, ``results.md`` and ``loss.png`` are rewritten from what
the row folders hold (:func:`spe.lab.lra.study_results.collect_study`), atomically, so runners
with disjoint ``only`` lists may share ``OUT`` and a last call collects everything.
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from spe.lab.lra.config import PRESETS, LRAConfig, preset_config
from spe.lab.lra.run import load_splits, run_lra
from spe.lab.lra.study_results import collect_study
from spe.lab.train.engine import TrainingDiverged
from spe.lab.train.run_folder import check_name

__all__ = ["StudyPlan", "load_study", "packaged_studies", "row_config", "run_study"]

log = logging.getLogger(__name__)

_ROW_KEYS_REFUSED = ("task", "preset")  # one task and one preset per study
_SPLIT_KEYS = ("task", "data", "max_length", "listops_pipeline", "data_options")


@dataclass
class StudyPlan:
    """A parsed study plan (see the module docstring).

    Attributes:
        path: the plan file.
        title: the results' title.
        task, preset: of every row.
        seeds: seeds of every row.
        reference: the row others are compared with, or None.
        baseline: the row that other rows change one thing of, or None (the loss plot draws it
            and the reference in every panel).
        groups: group name -> title, in the order of the results and the plot's panels.
        rows: name -> ``{"group", "description", "positional", "attention", "options", "changes"}``,
            options being the row's :class:`LRAConfig` overrides (``model`` included, ``[defaults]``
            merged in), changes the row's own, in plan order.
    """

    path: str
    title: str
    task: str
    preset: str
    seeds: list[int]
    reference: str | None
    baseline: str | None = None
    groups: dict[str, str] = field(default_factory=dict)
    rows: dict[str, dict] = field(default_factory=dict)


def packaged_studies() -> tuple[str, ...]:
    """Names of the packaged study plans (``src/spe/lab/configs/lra/*.toml`` that are not presets)."""
    folder = resources.files("spe.lab") / "configs" / "lra"
    return tuple(sorted(p.name[:-5] for p in folder.iterdir()
                        if p.name.endswith(".toml") and p.name[:-5] not in PRESETS))


def _read(path_or_name: str) -> tuple[str, dict]:
    path = Path(path_or_name)
    if not path.is_file():
        if path_or_name not in packaged_studies():
            raise ValueError(f"study plan {path_or_name!r} is neither a file nor a packaged plan "
                             f"({', '.join(packaged_studies())})")
        path = Path(str(resources.files("spe.lab") / "configs" / "lra" / f"{path_or_name}.toml"))
    try:
        return str(path), tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"study plan {path} is not valid TOML: {err}") from None


def _row(where: str, spec: dict, defaults: dict) -> dict:
    """One row's parsed table, its configuration checked (without data) by :class:`LRAConfig`."""
    spec = dict(spec)
    refused = [k for k in _ROW_KEYS_REFUSED if k in spec]
    if refused:
        raise ValueError(f"{where}: {', '.join(refused)} is set once for the whole plan, not per row")
    missing = [k for k in ("positional", "attention") if k not in spec]
    if missing:
        raise ValueError(f"{where}: give {' and '.join(missing)}")
    row = {"group": str(spec.pop("group", "rows")), "description": str(spec.pop("description", "")),
           "positional": spec.pop("positional"), "attention": spec.pop("attention")}
    base, own_model = dict(defaults), spec.pop("model", {})
    row["options"] = {**base, **spec, "model": {**base.pop("model", {}), **own_model}}
    row["changes"] = {**({"model": own_model} if own_model else {}), **spec}  # what the row adds to the defaults
    return row


def load_study(path_or_name: str) -> StudyPlan:
    """Reads a study plan file, or the name of a packaged one (e.g. ``listops-study``).

    Every row's configuration is built (no data, no model) so that a mistake in the plan is
    reported before anything runs.

    Raises:
        ValueError: naming the file (and the row) on a missing file, invalid TOML, a missing
            or unknown option, or a value :class:`LRAConfig` refuses.
    """
    path, raw = _read(path_or_name)
    rows = raw.pop("rows", None)
    if not rows or not isinstance(rows, dict):
        raise ValueError(f"study plan {path} has no [rows.NAME] tables")
    task, preset = raw.pop("task", None), raw.pop("preset", "cpu-small")
    if task is None:
        raise ValueError(f"study plan {path}: give task (e.g. task = \"listops\")")
    plan = StudyPlan(path=path, title=str(raw.pop("title", Path(path).stem)), task=task, preset=preset,
                     seeds=[int(s) for s in raw.pop("seeds", [0, 1, 2])], reference=raw.pop("reference", None),
                     baseline=raw.pop("baseline", None), groups=dict(raw.pop("groups", {})))
    defaults = raw.pop("defaults", {})
    if raw:
        raise ValueError(f"study plan {path}: unknown top-level key(s) {sorted(raw)}; known: title, task, preset, "
                         "seeds, reference, baseline, groups, defaults, rows")
    for key in ("reference", "baseline"):
        if getattr(plan, key) is not None and getattr(plan, key) not in rows:
            raise ValueError(f"study plan {path}: {key} {getattr(plan, key)!r} is not one of its rows")
    for name, spec in rows.items():
        where = f"study plan {path}, row {name!r}"
        check_name(name, where)
        plan.rows[name] = _row(where, spec, defaults)
        plan.groups.setdefault(plan.rows[name]["group"], plan.rows[name]["group"])
        try:
            row_config(plan, name)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: {err}") from None
    return plan


def row_config(plan: StudyPlan, name: str, **run_options) -> LRAConfig:
    """The :class:`LRAConfig` of row ``name``; ``run_options`` (e.g. ``steps``, ``device``, ``data``)
    win over the plan's, None values change nothing.

    Raises:
        ValueError: on an unknown row, or as :func:`~spe.lab.lra.preset_config`.
    """
    if name not in plan.rows:
        raise ValueError(f"unknown row {name!r} of study plan {plan.path}; rows: {', '.join(plan.rows)}")
    row = plan.rows[name]
    options = {**row["options"], **{k: v for k, v in run_options.items() if v is not None}}
    return preset_config(plan.task, row["positional"], row["attention"], preset=plan.preset, **options)


def _selected(plan: StudyPlan, only: list[str] | None) -> list[str]:
    if not only:
        return list(plan.rows)
    unknown = [n for n in only if n not in plan.rows]
    if unknown:
        raise ValueError(f"unknown row(s) {', '.join(unknown)} of study plan {plan.path}; rows: "
                         f"{', '.join(plan.rows)}")
    return [n for n in plan.rows if n in only]


def run_study(plan: StudyPlan, out: str | Path, *, only: list[str] | None = None, seeds: list[int] | None = None,
              threads: int | None = None, progress: bool = True, **run_options) -> dict:
    """Runs the rows of ``plan`` (each over every seed, resumably) into ``out/ROW``, then collects.

    Row by row, so that each row folder is a whole ``spe lra`` experiment as soon as it is
    done (run ``seeds=[0]`` first to have every row at one seed early). The splits are loaded
    once for consecutive rows that read the same data. A row whose training diverges is
    reported at the end; the other rows still run.

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
            :func:`run_lra`, or naming the rows that diverged (after the others ran).
    """
    out = Path(out)
    names = _selected(plan, only)
    configs = {name: row_config(plan, name, **run_options) for name in names}  # every mistake before any run
    diverged, cached = {}, (None, None)
    for name, cfg in configs.items():
        key = tuple(str(getattr(cfg, k)) for k in _SPLIT_KEYS)
        if cached[0] != key:
            cached = (None, None)  # frees the previous splits before loading others
            cached = (key, load_splits(cfg))
        try:
            run_lra(cfg, seeds or plan.seeds, out / name, threads=threads, progress=progress, splits=cached[1])
        except TrainingDiverged as err:
            log.warning("study row %s: %s", name, err)
            diverged[name] = str(err)
        collect_study(plan, out)
    if diverged:
        raise ValueError(f"row(s) {', '.join(diverged)} diverged (the others ran; results in {out}): "
                         + "; ".join(f"{k}: {v}" for k, v in diverged.items()))
    return collect_study(plan, out)

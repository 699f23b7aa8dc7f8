"""Plans of rows × seeds, run resumably into one folder: the runner under ``spe sweep`` and ``spe lra --plan``.

A plan is a TOML file::

    extends = "NAME"       # optional: another plan (a file beside this one, else a packaged plan;
                           # a file extending its own name extends the packaged plan of that name)
    title = "..."          # the results' title (default: the file's name)
    seeds = [0, 1, 2]      # every row runs once per seed (default [0, 1, 2])
    reference = "ape"      # optional: the row the others are compared with
    ...                    # the task's own top-level keys
    [rows.NAME]            # one table per row (spe sweep's plans called them [variants.NAME]: still read so)
    description = "..."
    ...                    # the row's options, as the task reads them

A plan that ``extends`` another starts from that plan's tables: its top-level keys replace the
base's, its tables (``[defaults]``, ``[defaults.model]``) are merged into the base's key by key,
and its rows follow the base's rows, a row of the same name replacing the base's whole.

A task says how its plans read (:class:`PlanFormat`: its top-level keys, how a row's table becomes
options); every row is checked when the plan is loaded, so that a mistake is reported, naming the
file and the row, before anything runs.

``OUT`` is claimed before any run (:func:`claim_folder`): a folder holding another tool's
``results.json`` / ``results.md`` or another command's results is refused, and spe's marker
records whose results it holds. Run (ROW, S) lives in ``OUT/ROW/seedS`` and is finished once ``OUT/ROW/seedS/result.json``
exists: :func:`run_plan` skips it (unless the task finds the stored result out of date) and
runs each other one under its folder's lock (:func:`~spe.lab.engine.run_folder.run_lock`),
writing its result there (a run another process holds is tried again after the others).
Results are collected from those files (:func:`collect`), never from an earlier results
table, so runners with disjoint row lists may share ``OUT``;
:func:`summarize` gives a row's mean ± sample std per metric (:mod:`spe.lab.stats`) and
:func:`markdown_table` its table.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar
from importlib import resources
from pathlib import Path

from spe.checkpoint import atomic_write
from spe.lab import strict_json
from spe.lab.stats import format_mean_std, mean_and_std
from spe.lab.options import read_json_object, read_toml, rename_old_names, set_threads
from spe.lab.experiment import quiet_defaults
from spe.lab.outputs import check_output_folder
from spe.lab.provenance import provenance
from spe.lab.engine.run_folder import MARKER_FILE, RunFolderBusy, check_name, mark_run, run_lock, spe_run_found
from spe.paths import not_a_file

__all__ = ["ANY_KIND", "PLAN_KEYS", "PLAN_TASKS", "RESULTS_FILES", "RESULT_FILE", "Column", "Plan", "PlanFormat",
           "PlanTask", "RunsFailed", "claim_folder", "collect", "collect_results", "load_plan", "markdown_table",
           "option_table", "packaged_plans", "plan_task", "read_result", "read_results", "results_lock", "run",
           "run_folder", "run_once", "run_plan", "select_rows", "summarize", "write_result", "write_results"]

log = logging.getLogger(__name__)

RESULT_FILE = "result.json"  # a run is finished once its folder holds it
PLAN_KEYS = ("title", "seeds", "reference")  # the top-level keys of every plan
_SEED_FOLDER = re.compile(r"seed(\d+)")


@dataclass(frozen=True)
class PlanFormat:
    """How one task's plan files read.

    Attributes:
        kind: how messages name a plan file (``"plan"``, ``"study plan"``).
        task: the task whose plans these are (:data:`PLAN_TASKS`: ``music``, ``lra``, ``synth``).
        rows_key: the top-level table of the rows (``"variants"``, ``"rows"``).
        row_word: how messages name a row (``"variant"``, ``"row"``).
        folder: the packaged plans' folder, relative to the ``spe.lab`` package.
        top_keys: the task's own top-level keys (beside :data:`PLAN_KEYS` and ``rows_key``).
        settings: the task's top-level keys (a dict, possibly empty) -> its settings, kept as
            :attr:`Plan.settings`; raises ValueError or TypeError on a mistake.
        row: (a row's table without ``description``, the settings) -> the row's options, a dict;
            raises ValueError or TypeError on a mistake.
        check: the whole plan, once every row is read -> None; raises ValueError (naming the
            file and the row) on a mistake between rows.
        not_plans: names of TOML files in ``folder`` that are not plans (configs, presets).
        plan_class: the :class:`Plan` subclass built.
        old_rows_key: the rows' table's old name, read as ``rows_key`` (the music plans' ``variants``).
    """

    kind: str
    rows_key: str
    row_word: str
    folder: str
    top_keys: tuple[str, ...]
    settings: Callable[[dict], dict]
    row: Callable[[dict, dict], dict]
    check: Callable[[Plan], None] = lambda plan: None
    not_plans: tuple[str, ...] = ()
    plan_class: type = None  # Plan when None
    task: str = ""
    old_rows_key: str | None = None


@dataclass
class Plan:
    """A parsed plan.

    Attributes:
        path: the plan file.
        title: the results' title.
        seeds: the seeds every row runs with.
        rows: name -> the row's options as the task read them, ``description`` included, in plan order.
        reference: the row the others are compared with, or None.
        settings: the task's top-level settings.
        format: how the plan was read (names rows and the file in messages).
    """

    path: str
    title: str
    seeds: list[int]
    rows: dict[str, dict] = field(default_factory=dict)
    reference: str | None = None
    settings: dict = field(default_factory=dict)
    format: PlanFormat | None = field(default=None, repr=False, compare=False)

    def where(self, name: str | None = None) -> str:
        """The plan (and row) as messages name them: ``plan FILE, variant 'NAME'``."""
        kind, word = (self.format.kind, self.format.row_word) if self.format else ("plan", "row")
        return f"{kind} {self.path}" + ("" if name is None else f", {word} {name!r}")


def option_table(value: object, key: str) -> dict:
    """``value``, a plan's table of options (``model``, ``eval``, ``defaults``).

    Raises:
        ValueError: naming ``key`` and the value, if it is not a table.
    """
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be a table of options ({key} = {{ name = value, ... }}), got {value!r}")
    return value


def packaged_plans(fmt: PlanFormat | str) -> dict[str, Path]:
    """Name -> file of the plans shipped in ``spe/lab/<fmt.folder>``, by name (``fmt``: a
    :class:`PlanFormat` or a task's name, ``music``, ``lra``, ``synth``)."""
    if isinstance(fmt, str):
        fmt = plan_task(fmt).format
    folder = resources.files("spe.lab").joinpath(*fmt.folder.split("/"))
    found = {p.name[:-5]: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".toml")}
    return {name: found[name] for name in sorted(found) if name not in fmt.not_plans}


def _merged(base: dict, child: dict, rows_key: str | None) -> dict:
    """``child`` over ``base``: tables merged key by key, the rows' table row by row (a row whole)."""
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value} if key == rows_key else _merged(out[key], value, rows_key=None)
        else:
            out[key] = value
    return out


def _read(path_or_name: str, fmt: PlanFormat, seen: tuple[Path, ...] = ()) -> tuple[Path, dict]:
    path, raw = _read_file(path_or_name, fmt)
    base = raw.pop("extends", None)
    if base is None:
        return path, raw
    where = f"{fmt.kind} {path}"
    if not isinstance(base, str) or not base:
        raise ValueError(f"{where}: extends must name a plan, got {base!r}")
    if path.resolve() in seen:
        chain = " -> ".join(str(p) for p in (*seen, path.resolve()))
        raise ValueError(f"{where}: extends makes a cycle ({chain})")
    try:
        _, parent = _read(_base_source(path, base, fmt), fmt, (*seen, path.resolve()))
    except ValueError as err:
        raise ValueError(f"{where}: extends {base!r}: {err}") from None
    return path, _merged(parent, raw, fmt.rows_key)


def _base_source(path: Path, base: str, fmt: PlanFormat) -> str:
    """What ``extends = base`` in ``path`` reads: the file beside ``path`` of that name, or the packaged
    plan of that name where that file is ``path`` itself (a local ``ablation.toml`` may extend the
    packaged ``ablation``).

    Raises:
        ValueError: where ``base`` names ``path`` itself and no packaged plan is called so.
    """
    beside = path.parent / (base if base.endswith(".toml") else f"{base}.toml")
    if not beside.is_file():
        return base
    if beside.resolve() != path.resolve():
        return str(beside)
    name = beside.name[:-5]
    packaged = packaged_plans(fmt)
    if name not in packaged:
        raise ValueError(f"it names this file itself, and no packaged {fmt.kind} is called {name!r} "
                         f"({', '.join(packaged)})")
    return str(packaged[name])


def _read_file(path_or_name: str, fmt: PlanFormat) -> tuple[Path, dict]:
    path = Path(path_or_name)
    if not path.is_file():
        packaged = packaged_plans(fmt)
        if path_or_name not in packaged:
            problem = not_a_file(path)
            if problem != "does not exist":  # something is there: say what
                raise ValueError(f"{fmt.kind} {path_or_name} {problem}")
            raise ValueError(f"{fmt.kind} {path_or_name!r} is neither a file nor a packaged plan "
                             f"({', '.join(packaged)})")
        path = packaged[path_or_name]
    raw = read_toml(path, fmt.kind)
    if fmt.old_rows_key:
        raw = rename_old_names(raw, {fmt.old_rows_key: fmt.rows_key}, f"{fmt.kind} {path}")
    return path, raw


def _seeds(where: str, seeds: object) -> list[int]:
    ok = isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                   for s in seeds) and len(set(seeds)) == len(seeds)
    if not ok:
        raise ValueError(f"{where}: seeds must be a non-empty list of distinct integers ≥ 0, got {seeds!r}")
    return list(seeds)


def load_plan(path_or_name: str, fmt: PlanFormat | str) -> Plan:
    """Reads a plan file, or the name of one shipped in ``fmt.folder``, and checks every row.

    ``fmt`` is the task's name (``music``, ``lra``, ``synth``: its :attr:`PlanTask.format`) or a
    :class:`PlanFormat`.

    Raises:
        ValueError: naming the file (and the row) on a missing file, invalid TOML, a base plan
            (``extends``) that is missing or extends this one again, no rows, an unknown
            top-level key, bad seeds, a reference that is not a row, a row name that is not a
            plain folder name (:func:`~spe.lab.engine.run_folder.check_name`), or
            whatever the task refuses in its settings, a row or the whole plan.
    """
    if isinstance(fmt, str):
        fmt = plan_task(fmt).format
    path, raw = _read(path_or_name, fmt)
    where = f"{fmt.kind} {path}"
    rows = raw.pop(fmt.rows_key, None)
    if not rows or not isinstance(rows, dict):
        raise ValueError(f"{where} has no [{fmt.rows_key}.NAME] tables")
    known = (*PLAN_KEYS, *fmt.top_keys, fmt.rows_key)
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown top-level key(s) {unknown}; known: {', '.join(known)}")
    reference = raw.pop("reference", None)
    if reference is not None and reference not in rows:
        raise ValueError(f"{where}: reference {reference!r} is not one of its {fmt.row_word}s ({', '.join(rows)})")
    plan = (fmt.plan_class or Plan)(path=str(path), title=str(raw.pop("title", path.stem)),
                                    seeds=_seeds(where, raw.pop("seeds", [0, 1, 2])), reference=reference,
                                    format=fmt)
    try:
        plan.settings = fmt.settings(raw)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None
    for name, table in rows.items():
        check_name(name, plan.where(name))
        if not isinstance(table, dict):
            raise ValueError(f"{plan.where(name)}: give a table ([{fmt.rows_key}.{name}]), got {table!r}")
        table = dict(table)
        description = str(table.pop("description", ""))
        try:
            with quiet_defaults():  # checked here; the runs say their defaults when they start
                plan.rows[name] = {**fmt.row(table, plan.settings), "description": description}
        except (TypeError, ValueError) as err:
            raise ValueError(f"{plan.where(name)}: {err}") from None
    fmt.check(plan)
    return plan


def select_rows(plan: Plan, only: Iterable[str] | None) -> list[str]:
    """The rows named in ``only`` (all when None or empty), in plan order.

    Raises:
        ValueError: naming the plan, on a name that is not one of its rows.
    """
    only = list(only or ())
    unknown = [n for n in only if n not in plan.rows]
    if unknown:
        word = plan.format.row_word if plan.format else "row"
        raise ValueError(f"unknown {word}(s) {', '.join(unknown)} of {plan.where()}; {word}s: {', '.join(plan.rows)}")
    return [n for n in plan.rows if not only or n in only]


def run_folder(out: str | Path, name: str, seed: int) -> Path:
    """``out/NAME/seedS``: the folder of run (row ``name``, ``seed``)."""
    return Path(out) / name / f"seed{seed}"


def read_result(folder: str | Path) -> dict | None:
    """The result stored in a run folder, or None while the run is not finished.

    Raises:
        ValueError: naming the file, if it is not a JSON object.
    """
    file = Path(folder) / RESULT_FILE
    return read_json_object(file, "a run's result") if file.is_file() else None


def write_result(folder: str | Path, result: dict) -> None:
    """Stores a run's result (atomically): the run is finished from then on."""
    atomic_write(Path(folder) / RESULT_FILE, lambda tmp: Path(tmp).write_text(strict_json.dumps(result, indent=2)))


def read_results(folder: str | Path) -> dict[int, dict]:
    """Seed -> result of every finished run in a row's folder (``seedS/result.json``), by seed."""
    folder, found = Path(folder), {}
    for sub in folder.iterdir() if folder.is_dir() else ():
        match = _SEED_FOLDER.fullmatch(sub.name)
        if match and (result := read_result(sub)) is not None:
            found[int(match.group(1))] = result
    return dict(sorted(found.items()))


def collect(plan: Plan, out: str | Path) -> dict[str, dict[int, dict]]:
    """Row -> seed -> result of every finished run of the plan's rows under ``out`` (any seed)."""
    return {name: read_results(Path(out) / name) for name in plan.rows}


def run_once(folder: str | Path, run: Callable[[Path], dict], *, current: Callable[[dict], bool] | None = None,
             ctx=None, config: Callable[[], Mapping] | None = None) -> dict:
    """The result of the run in ``folder``: the stored one if the run is finished (and ``current``
    accepts it), otherwise ``run(folder)``'s, run under the folder's lock and then stored.

    Args:
        folder: the run folder.
        run: trains (or resumes) and evaluates the run; returns its result, a JSON-able dict.
        current: stored result -> whether it still answers the plan (None: always); it may
            raise to refuse the folder.
        ctx: the :class:`~spe.lab.engine.distributed.Distributed` context under ``torchrun``
            (rank 0 locks and writes), None for one process.
        config: () -> the run's resolved configuration, recorded with its hash in the result's
            ``provenance`` (:func:`spe.lab.provenance.provenance`, which every result a run stores
            gets: commit, versions, threads, host, times).

    Raises:
        RunFolderBusy: if another process holds the folder.
    """
    folder = Path(folder)
    stored = read_result(folder)
    if stored is not None and (current is None or current(stored)):
        return stored
    with run_lock(folder, ctx):
        stored = read_result(folder)  # finished by another runner since
        if stored is not None and (current is None or current(stored)):
            return stored
        started = time.time()
        result = run(folder)
        result = {**result, "provenance": provenance(started=started, ended=time.time(),
                                                     config=None if config is None else config())}
        if ctx is None or ctx.is_main:
            write_result(folder, result)
    return result


class RunsFailed(ValueError):
    """Runs of a plan failed (after the others ran)."""


def run_plan(plan: Plan, out: str | Path, run: Callable[[str, int, Path], dict], *,
             rows: Sequence[str] | None = None, seeds: Sequence[int] | None = None, by_seed: bool = True,
             current: Callable[[str, int, dict], bool] | None = None,
             after: Callable[[str, int, dict], None] | None = None,
             failures: tuple[type[Exception], ...] = (), ctx=None,
             config: Callable[[str, int], Mapping] | None = None) -> dict[str, dict[int, dict]]:
    """Runs every (row, seed) not finished yet (:func:`run_once`); returns row -> seed -> result.

    Args:
        plan: the plan.
        out: the plan's folder; run (ROW, S) lives in ``out/ROW/seedS``.
        run: (row, seed, run folder) -> the run's result; trains one run, the task's part.
        rows: the rows to run, in this order (default: all, in plan order).
        seeds: the seeds (default: the plan's).
        by_seed: seed by seed (every row at the first seeds early), else row by row (each row
            whole early).
        current: (row, seed, stored result) -> whether it still answers the plan (default: yes).
        after: called with (row, seed, result) after each run that ran (not after skipped ones).
        failures: exceptions of one run that do not stop the others; they are raised together
            at the end as :class:`RunsFailed`.
        ctx: as :func:`run_once`.
        config: (row, seed) -> the run's resolved configuration, for its provenance
            (:func:`run_once`).

    Raises:
        ValueError: if ``out`` is another tool's or another kind's folder (:func:`claim_folder`).
        RunFolderBusy: (a ValueError) naming the runs another process still held once every other
            run was done (they are tried again last; under torchrun, at the first such run).
        RunsFailed: (a ValueError) naming the runs that raised one of ``failures``.
    """
    claim_folder(out, plan.format.kind if plan.format else "plan", ctx=ctx)
    rows, seeds = list(plan.rows if rows is None else rows), list(plan.seeds if seeds is None else seeds)
    pairs = [(r, s) for s in seeds for r in rows] if by_seed else [(r, s) for r in rows for s in seeds]
    results, failed, busy, deferred = {}, {}, [], set()
    # A run another process holds is appended once, to be tried again after the others (it may
    # have finished by then; its result is then read, not rerun), so that one busy folder does not
    # stop a runner's other runs. Under torchrun every rank must take the same path, so there the
    # first busy run refuses at once.
    for name, seed in pairs:
        ran = []

        def run_here(folder: Path, name=name, seed=seed) -> dict:
            ran.append(True)
            return run(name, seed, folder)

        check = None if current is None else (lambda stored, name=name, seed=seed: current(name, seed, stored))
        try:
            describe = None if config is None else (lambda name=name, seed=seed: config(name, seed))
            result = run_once(run_folder(out, name, seed), run_here, current=check, ctx=ctx, config=describe)
        except RunFolderBusy as err:
            if ctx is not None:
                raise
            if (name, seed) in deferred:
                busy.append(str(err))
                continue
            log.warning("%s/seed%d is being run by another process: running the others first", name, seed)
            deferred.add((name, seed))
            pairs.append((name, seed))
            continue
        except failures as err:
            log.warning("%s/seed%d: %s", name, seed, err)
            failed[f"{name}/seed{seed}"] = str(err)
            continue
        results.setdefault(name, {})[seed] = result
        if ran and after is not None:
            after(name, seed, result)
    if busy:  # after every run that could run: nothing this runner could do is left undone
        done = sum(len(v) for v in results.values())
        raise RunFolderBusy(f"{'; '.join(busy)} (the other {done} run(s) are done; rerun this once "
                            "the other process ends: finished runs are read, not rerun)"
                            + (f"; also failed: {', '.join(failed)}" if failed else ""))
    if failed:
        raise RunsFailed(f"run(s) {', '.join(failed)} failed (the others ran; results in {out}): "
                         + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    return results


RESULTS_FILES = ("results.json", "results.md")  # what a plan (and an spe synth experiment) writes in its --out
ANY_KIND = "results"  # the marker of results collected before any run said whose they are


def _marked_by(marker: Path) -> str:
    try:
        owner = json.loads(marker.read_text()).get("spe_run")
    except (OSError, ValueError, AttributeError):
        owner = None
    return owner if isinstance(owner, str) else "an unreadable spe marker"


def _holds_runs(out: Path) -> bool:
    """``out`` holds runs of a plan or experiment written before folders were marked: a ``seedS``
    folder (or ``ROW/seedS``) with a result or an spe run in it."""
    return any(_SEED_FOLDER.fullmatch(d.name) and ((d / RESULT_FILE).is_file() or spe_run_found(d))
               for d in (*out.glob("seed*"), *out.glob("*/seed*")) if d.is_dir())


def claim_folder(out: str | Path, kind: str, files: Sequence[str] = RESULTS_FILES, ctx=None) -> Path:
    """Makes ``out`` the folder of one ``kind`` of results (``"plan"``, ``"synth plan"``, ``"synth"``),
    created and marked (:func:`~spe.lab.engine.run_folder.mark_run`) unless it is already.

    Called before any run: a folder that holds another tool's ``files`` (which the results would
    replace) or another kind's results is refused, so nothing there is lost.

    Args:
        out: the ``--out`` folder.
        kind: what writes there; the marker records it.
        files: the names written directly in ``out``.
        ctx: the :class:`~spe.lab.engine.distributed.Distributed` context (rank 0 checks and marks), or None.

    Raises:
        ValueError: naming the folder and the files, if ``out`` is a file, is marked by another
            kind, or holds one of ``files`` but neither spe's marker nor any run.
    """
    out = check_output_folder(out, "--out")
    if ctx is not None and not ctx.is_main:
        return out
    marker = out / MARKER_FILE
    if marker.is_file():
        owner = _marked_by(marker)
        if owner == ANY_KIND and kind != ANY_KIND:  # collected before any run: now this kind's
            marker.write_text(json.dumps({"spe_run": kind}) + "\n")
        elif owner != kind and kind != ANY_KIND:
            raise ValueError(f"--out {out} holds the results of {owner!r} ({marker.name}), not of a {kind}: "
                             "choose another --out (nothing was changed)")
    elif out.is_dir():
        taken = [name for name in files if (out / name).exists()]
        if taken and not _holds_runs(out):
            raise ValueError(f"--out {out} holds no spe results but {', '.join(taken)}, which this {kind} would "
                             "write over: choose another --out (nothing was changed)")
    out.mkdir(parents=True, exist_ok=True)
    mark_run(out, kind)
    return out


@contextlib.contextmanager
def results_lock(out: str | Path) -> Iterator[Path]:
    """Waits for, then holds, ``out``'s results lock: runners sharing ``out`` collect and write
    its results tables one at a time, so that the last writer's tables hold every finished run.

    Raises:
        ValueError: if ``out`` holds another tool's results files (:func:`claim_folder`).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".results.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (out / MARKER_FILE).is_file():  # a collection before any run: another tool's tables refused
            claim_folder(out, ANY_KIND)
        yield out


def summarize(runs: Mapping[int, dict], metrics: Mapping[str, Callable[[dict], float]]) -> dict:
    """A row's summary over its runs: ``seeds`` (as given) and, per metric, ``(mean, sample std)``
    (:func:`spe.lab.stats.mean_and_std`: std NaN for one run; None for no run).

    Args:
        runs: seed -> result.
        metrics: name -> result -> value.
    """
    summary = {"seeds": list(runs)}
    for key, value in metrics.items():
        summary[key] = mean_and_std(value(r) for r in runs.values()) if runs else None
    return summary


@dataclass(frozen=True)
class Column:
    """One column of a results table.

    Attributes:
        header: the column's title.
        metric: a ``(mean, std)`` of the row's summary, written ``m ± s`` (``–`` for no spread,
            and for a row without it).
        digits: decimals of ``metric``.
        cell: row summary -> the cell's text, instead of ``metric``.
    """

    header: str
    metric: str | None = None
    digits: int = 2
    cell: Callable[[dict], str] | None = None

    def text(self, row: dict) -> str:
        if self.cell is not None:
            return self.cell(row)
        value = row.get(self.metric)
        return "–" if value is None else format_mean_std(*value, digits=self.digits)


def markdown_table(rows: Iterable[dict], columns: Sequence[Column]) -> list[str]:
    """The Markdown lines of a table: one line per row summary, one cell per column."""
    return ["| " + " | ".join(c.header for c in columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(c.text(r) for c in columns) + " |" for r in rows)]


# --- one runner for every task -----------------------------------------------------------------------------

PLAN_TASKS = {"music": ("spe.lab.music.plan", "MusicPlans"), "lra": ("spe.lab.lra.study", "LRAPlans"),
              "synth": ("spe.lab.synth.study", "SynthPlans")}  # task -> its PlanTask (imported when asked for)


def plan_task(task: str) -> type[PlanTask]:
    """The :class:`PlanTask` of ``task`` (``music``, ``lra``, ``synth``: :data:`PLAN_TASKS`).

    Raises:
        ValueError: naming the task and the known ones.
    """
    if task not in PLAN_TASKS:
        raise ValueError(f"unknown task {task!r}; tasks: {', '.join(PLAN_TASKS)}")
    module, name = PLAN_TASKS[task]
    return getattr(importlib.import_module(module), name)


class PlanTask:
    """One task's side of a plan run: what :func:`run` and :func:`collect_results` ask of the music
    language model, the LRA classifiers and the synthetic tasks. A subclass is made for one plan and
    one ``--out``; making it builds (so checks) every selected row's configuration before any run.

    Class attributes:
        name: the task, as :data:`PLAN_TASKS` and the default ``--out`` (``runs/NAME/PLAN``) name it.
        format: how its plans read (:class:`PlanFormat`).
        by_seed: seed by seed (every row at the first seeds early), else row by row (each row whole early).
        run_options: the options a command sets for every row (``steps``, ``device`` …; None: the plan's).
        figures: files beside the results tables that :meth:`written` draws.

    Attributes:
        plan, out, names (the rows to run, in order), seeds (this call's), options (the run
        options given), progress.
    """

    name: ClassVar[str] = ""
    format: ClassVar[PlanFormat]
    by_seed: ClassVar[bool] = True
    run_options: ClassVar[tuple[str, ...]] = ()
    figures: ClassVar[tuple[str, ...]] = ()

    def __init__(self, plan: Plan, out: str | Path, *, only: Iterable[str] | None = None,
                 seeds: Sequence[int] | None = None, progress: bool = True, **run_options):
        unknown = sorted(set(run_options) - set(self.run_options))
        if unknown:
            raise TypeError(f"{self.name} plans take the run options {', '.join(self.run_options)}, not {unknown}")
        self.plan, self.out, self.progress = plan, Path(out), progress
        self.seeds = list(seeds or plan.seeds)
        self.options = {k: v for k, v in run_options.items() if v is not None}
        self.names = self.select(only)

    @classmethod
    def default_out(cls, plan: Plan) -> Path:
        """Where a plan runs when no ``--out`` is given: ``runs/TASK/PLAN``."""
        return Path("runs") / cls.name / Path(plan.path).stem

    def select(self, only: Iterable[str] | None) -> list[str]:
        """The rows to run (``only``; all when None or empty), in the order they run."""
        return select_rows(self.plan, only)

    def processes(self):
        """The context the runs share (a :class:`~spe.lab.engine.distributed.Distributed` under
        ``torchrun`` for a task that trains across processes), entered around them; None: one process."""
        return contextlib.nullcontext()

    def open(self, ctx) -> None:
        """Prepares the row folders, or refuses one that holds another experiment, before any run."""

    def config(self, name: str, seed: int) -> Mapping:
        """The run's resolved configuration, recorded in its provenance."""
        raise NotImplementedError

    def run(self, name: str, seed: int, folder: Path) -> dict:
        """Trains (or resumes) and evaluates run (``name``, ``seed``) in ``folder``; returns its result."""
        raise NotImplementedError

    def current(self, name: str, seed: int, stored: dict) -> bool:
        """Whether a stored result still answers the plan (else the run resumes or is evaluated again)."""
        return True

    def after(self, name: str, seed: int, result: dict, ctx) -> None:
        """After each run that ran, before the plan's results are collected (a row's own summary)."""

    def results(self) -> tuple[dict, str | None]:
        """(``results.json``'s content, ``results.md``'s text or None for none yet) from the finished runs under ``out``."""
        raise NotImplementedError

    def written(self, doc: dict) -> None:
        """After the results files, what else the task draws from them (a plot)."""


def write_results(out: str | Path, doc: dict, markdown: str | None) -> None:
    """Writes ``out/results.json`` (``doc``) and ``out/results.md`` (``markdown``, unless None), each atomically."""
    out = Path(out)
    atomic_write(out / "results.json", lambda tmp: Path(tmp).write_text(strict_json.dumps(doc, indent=2)))
    if markdown is not None:
        atomic_write(out / "results.md", lambda tmp: Path(tmp).write_text(markdown))


def _write_collected(task: PlanTask) -> dict:
    """Rebuilds ``OUT/results.json`` and ``OUT/results.md`` (and what the task draws) from the runs'
    records, one runner at a time (:func:`results_lock`); returns the document."""
    with results_lock(task.out):
        doc, markdown = task.results()
        write_results(task.out, doc, markdown)
        task.written(doc)
    return doc


def run(plan: Plan, out: str | Path, *, only: Iterable[str] | None = None, seeds: Sequence[int] | None = None,
        threads: int | None = None, progress: bool = True, **run_options) -> dict:
    """Runs every (row, seed) of ``plan`` not finished yet into ``out``, whichever its task; returns the
    results document (``OUT/results.json``'s content), collected after every run and at the end.

    Args:
        plan: from :func:`load_plan`.
        out: the plan's folder; run (ROW, S) lives in ``out/ROW/seedS``.
        only: rows to run (default all); runners with disjoint lists may share ``out``.
        seeds: overrides the plan's seeds.
        threads: CPU threads (None or 0: PyTorch's default).
        progress: progress bars.
        run_options: the task's run options for every row (:attr:`PlanTask.run_options`).

    Raises:
        ValueError: on an unknown row, a bad option, a folder of another tool, kind or experiment,
            or naming the runs whose training diverged (:class:`RunsFailed`, after the others ran).
    """
    from spe.lab.engine.core import TrainingDiverged  # torch: imported when a plan runs

    cls = plan_task(plan.format.task)
    if "threads" in cls.run_options:  # a task whose configs carry the thread count
        run_options["threads"] = threads
    task = cls(plan, out, only=only, seeds=seeds, progress=progress, **run_options)
    set_threads(threads)
    with task.processes() as ctx:
        main = ctx is None or ctx.is_main
        claim_folder(task.out, plan.format.kind, ctx=ctx)  # before any row folder is made in it
        task.open(ctx)

        def after(name: str, seed: int, result: dict) -> None:
            task.after(name, seed, result, ctx)
            if main:
                _write_collected(task)

        try:
            run_plan(plan, task.out, task.run, rows=task.names, seeds=task.seeds, by_seed=task.by_seed,
                     current=task.current, after=after, failures=(TrainingDiverged,), ctx=ctx, config=task.config)
        finally:
            doc = _write_collected(task) if main else {}
    return doc


def collect_results(plan: Plan, out: str | Path, **run_options) -> dict:
    """Rebuilds ``OUT/results.*`` from what has run, training nothing (``--collect``); returns the document.

    Raises:
        ValueError: if ``out`` holds another tool's results files (:func:`results_lock`).
    """
    return _write_collected(plan_task(plan.format.task)(plan, out, **run_options))

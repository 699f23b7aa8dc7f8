"""Plans of variants × seeds, trained and evaluated resumably (``spe sweep``).

A plan is a TOML file: top-level keys are training options shared by every variant (on top
of the packaged demo config), ``[model]`` shared model options, ``[eval]`` shared evaluation
options, and one
``[variants.NAME]`` table per variant with its own training keys, a ``model`` table and
optionally an ``eval`` table (``num_realizations``, ``num_draws``; ``max_length`` and
``bucket_width``, by default 3× and 1× the variant's training length; ``window``, the sliding
attention window at test time, 0 for the whole past; ``split``, the pieces evaluated, as
``spe evaluate --split``: ``test`` with ``test_min_tokens`` = 16 L + 1 is the 16× protocol, and
then ``max_length`` defaults to 16 L) and ``description``.
A variant with ``checkpoints_of = "OTHER"`` trains nothing and re-evaluates OTHER's
checkpoints with its own ``eval`` options (test-time levers cost no training).
Model defaults are those of :class:`~spe.lab.train.TrainConfig` (e.g. a window of the training
length for SPE models), so a variant builds the model ``spe train`` builds from the same options.

Every finished run is skipped when the sweep is started again, an interrupted one resumes
(:func:`~spe.lab.train.status.run_status` decides), and ``OUT/results.json`` /
``OUT/results.md`` are rewritten (atomically) after every run, so nothing is lost when a
sweep is stopped.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from spe.lab import strict_json
from spe.checkpoint import atomic_write, load_checkpoint
from spe.lab.data.split import SPLITS
from spe.lab.evaluation.checkpoints import evaluate_checkpoints
from spe.lab.stats import SEED_SPREAD, format_mean_std, mean_and_std
from spe.lab.train.config import TrainConfig, load_config_file, packaged_config
from spe.lab.train.loop import train
from spe.lab.train.run_folder import check_name, run_lock
from spe.lab.train.status import run_status
from spe.models.config import decode_window

log = logging.getLogger(__name__)

__all__ = ["Plan", "load_plan", "results_table", "run_sweep", "summarize_runs", "variant_config",
           "write_results"]

EVAL_KEYS = ("num_realizations", "num_draws", "max_length", "bucket_width", "window", "split")


@dataclass
class Plan:
    """A parsed plan: merged training options per variant, evaluation options, seeds.

    Attributes:
        path: the plan file.
        title: the results' title.
        seeds: seeds every variant is trained with.
        reference: the variant others are compared with in the results table, or None.
        variants: name -> ``{"train": options, "eval": options, "description": str,
            "of": name of the variant whose checkpoints it re-evaluates, or None}``.
    """

    path: str
    title: str
    seeds: list[int]
    reference: str | None
    variants: dict[str, dict] = field(default_factory=dict)


def _read_plan(path_or_name: str) -> tuple[Path, dict]:
    path = Path(path_or_name)
    if not path.is_file() and packaged_config(path_or_name).is_file():
        path = packaged_config(path_or_name)
    if not path.is_file():
        raise ValueError(f"plan {path_or_name} is neither a file nor a packaged plan")
    try:
        return path, tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"plan {path} is not valid TOML: {err}") from None


def _check_eval(where: str, evaluation: dict) -> None:
    unknown = set(evaluation) - set(EVAL_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown eval option(s) {sorted(unknown)}; known: {', '.join(EVAL_KEYS)}")
    for key, value in evaluation.items():
        if key == "window":
            decode_window(value, f"{where}: eval option window")
        elif key == "split":
            if value not in SPLITS:
                raise ValueError(f"{where}: eval option split must be one of {', '.join(SPLITS)}, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: eval option {key} must be an integer ≥ 1, got {value!r}")


def _variant(where: str, spec: dict, variants: dict, base: dict, base_model: dict, base_eval: dict) -> dict:
    spec = dict(spec)
    of = spec.pop("checkpoints_of", None)
    if of is not None and (of not in variants or variants[of].get("checkpoints_of")):
        raise ValueError(f"{where}: checkpoints_of must name a variant that trains")
    evaluation = {**base_eval, **spec.pop("eval", {})}
    _check_eval(where, evaluation)
    description = spec.pop("description", "")
    train_options = {**base, **spec, "model": {**base_model, **spec.pop("model", {})}}
    try:
        TrainConfig.from_dict(train_options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None
    return {"train": train_options, "eval": evaluation, "description": description, "of": of}


def load_plan(path_or_name: str) -> Plan:
    """Reads a plan file (or the name of a packaged one, e.g. ``ablation``).

    Raises:
        ValueError: naming the file and the variant, on a missing file, invalid TOML, an
            unknown option or an invalid value.
    """
    path, raw = _read_plan(path_or_name)
    variants = raw.pop("variants", None)
    if not variants:
        raise ValueError(f"plan {path} has no [variants.NAME] tables")
    title = raw.pop("title", path.stem)
    seeds = raw.pop("seeds", [0, 1, 2])
    reference = raw.pop("reference", None)
    if reference is not None and reference not in variants:
        raise ValueError(f"plan {path}: reference {reference!r} is not one of its variants ({', '.join(variants)})")
    base = load_config_file(packaged_config("demo"))
    base_model = {**base.pop("model", {}), **raw.pop("model", {})}
    base_eval = raw.pop("eval", {})  # every variant's eval options, under its own
    base.update(raw)
    plan = Plan(path=str(path), title=title, seeds=[int(s) for s in seeds], reference=reference)
    for name, spec in variants.items():
        check_name(name, f"plan {path}, variant {name!r}")
        plan.variants[name] = _variant(f"plan {path}, variant {name!r}", spec, variants, base, base_model, base_eval)
    for name, spec in plan.variants.items():  # refused now rather than after the training it would follow
        source = spec["of"] or name
        if spec["eval"].get("split") == "test" and not plan.variants[source]["train"].get("test_min_tokens"):
            raise ValueError(f"plan {path}, variant {name!r}: eval option split = \"test\" needs the training "
                             f"option test_min_tokens (e.g. 16 × seq_len + 1) in variant {source!r}, "
                             "whose runs hold no test split otherwise")
    return plan


def variant_config(plan: Plan, name: str, seed: int, out: Path, *, data: str | None = None,
                   cache_dir: str | None = None, steps: int | None = None,
                   threads: int | None = None) -> TrainConfig:
    """The training configuration of (variant, seed): its run folder is ``out/SOURCE/seedS``,
    SOURCE being the variant whose checkpoints it uses. ``data``, ``cache_dir``, ``steps``
    and ``threads`` (CPU threads; 0: PyTorch's default) override the plan's when given."""
    source = plan.variants[name]["of"] or name
    raw = {**plan.variants[source]["train"], "seed": seed, "out": str(out / source / f"seed{seed}")}
    for key, value in (("data", data), ("cache_dir", cache_dir), ("steps", steps), ("threads", threads)):
        if value is not None:
            raw[key] = value
    return TrainConfig.from_dict(raw)


def _selected(plan: Plan, only: list[str] | None) -> list[str]:
    """Variants to run, training ones first (re-evaluations then find their checkpoints)."""
    names = list(plan.variants)
    if only:
        unknown = set(only) - set(names)
        if unknown:
            raise ValueError(f"unknown variant(s) {sorted(unknown)} in plan {plan.path}; known: {', '.join(names)}")
        wanted = set(only) | {plan.variants[n]["of"] for n in only if plan.variants[n]["of"]}
        names = [n for n in names if n in wanted]
    return sorted(names, key=lambda n: plan.variants[n]["of"] is not None)


def _train_run(plan: Plan, name: str, cfg: TrainConfig, progress: bool) -> float | None:
    """Trains (or resumes) the run of ``cfg`` unless finished; returns the training time in s (None if skipped)."""
    spec = plan.variants[name]
    source = spec["of"] or name
    status = run_status(cfg)
    if status.state != "new" and status.differences:
        raise ValueError(f"{status.out} was trained with model options or data that variant {source!r} no longer "
                         f"asks for: {status.describe()}; use another --out or delete that run")
    if spec["of"] is not None:
        if status.state == "new":
            raise ValueError(f"variant {name!r} re-evaluates {source!r}, whose run {status.out} does not exist")
        return None
    if status.state == "finished":
        return None
    t = time.perf_counter()
    log.info("sweep: training %s/seed%d (%d steps)", name, cfg.seed, cfg.steps)
    train(cfg, resume=status.state == "resume", progress=progress)
    return time.perf_counter() - t


def _evaluate_run(spec: dict, cfg: TrainConfig, out: Path) -> dict:
    """The run's checkpoint on its validation split (or the eval option ``split``) with the variant's
    eval options; ``max_length`` defaults as in :func:`~spe.lab.evaluation.checkpoints.evaluate_models`."""
    options = spec["eval"]
    loaded = load_checkpoint(cfg.out, device=cfg.device)
    return evaluate_checkpoints([loaded], out, max_length=options.get("max_length"), split=options.get("split"),
                                data=cfg.data, cache_dir=cfg.cache_dir, batch_size=8, device=cfg.device,
                                json_path=None, progress=False, num_realizations=options.get("num_realizations"),
                                num_draws=options.get("num_draws", 1), bucket_width=options.get("bucket_width"),
                                window=options.get("window"))


def _save_results(doc: dict, plan: Plan, out: Path, new_runs: dict | None = None) -> dict:
    """Writes ``doc`` with ``new_runs`` added to the runs already in ``OUT/results.json`` at the
    moment of writing, under a lock: sweeps side by side on one folder (``--only`` lists, one
    core each) then add their runs instead of replacing each other's. Returns what was written."""
    import fcntl

    with open(out / ".results.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        path = out / "results.json"
        current = json.loads(path.read_text()) if path.exists() else {}
        merged = {**current, **{k: v for k, v in doc.items() if k != "runs"}}
        merged["runs"] = {**doc.get("runs", {}), **current.get("runs", {}), **(new_runs or {})}
        atomic_write(path, lambda tmp: Path(tmp).write_text(strict_json.dumps(merged, indent=2)))
        write_results(merged, plan, out / "results.md")
    return merged


def run_sweep(plan: Plan, out: Path, *, seeds: list[int] | None = None, only: list[str] | None = None,
              data: str | None = None, cache_dir: str | None = None, steps: int | None = None,
              threads: int | None = None,
              progress: bool = True) -> dict:
    """Trains and evaluates every (variant, seed) of the plan; returns the results document.

    Seed by seed, so that a stopped sweep has every variant at the first seeds. A run whose
    checkpoint step and eval options are those already in ``results.json`` is not evaluated again.

    Args:
        plan: from :func:`load_plan`.
        out: sweep folder; run ``NAME/seedS`` lives under it.
        seeds: overrides the plan's seeds.
        only: variants to run (default all); those whose checkpoints they reuse are added.
        data: training data for every variant (default: each variant's, i.e. the Bach default).
        cache_dir: converted MIDI and token caches.
        steps: overrides every variant's optimizer steps.
        threads: overrides every variant's CPU threads (e.g. 1 to run two sweeps side by side).
        progress: progress bars.

    Raises:
        ValueError: on an unknown variant name in ``only``, or a run folder trained with other options.
    """
    order = _selected(plan, only)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    doc = json.loads(results_path.read_text()) if results_path.exists() else {}
    doc.update(title=plan.title, plan=plan.path, reference=plan.reference, data=data or "Bach chorales (music21)")
    runs = doc.setdefault("runs", {})
    new: dict = {}  # this sweep's evaluated runs: they win over what the file holds when saving
    for seed in seeds or plan.seeds:
        for name in order:
            spec, key = plan.variants[name], f"{name}/seed{seed}"
            cfg = variant_config(plan, name, seed, out, data=data, cache_dir=cache_dir, steps=steps,
                                 threads=threads)
            with run_lock(cfg.out):  # the run's status is read and acted on by one runner at a time
                train_s = _train_run(plan, name, cfg, progress)
            step = run_status(cfg).step
            previous = runs.get(key, {})
            if previous.get("step") == step and previous.get("eval") == spec["eval"] and "buckets" in previous:
                continue
            with run_lock(out / name / f"seed{seed}-evaluation"):
                summary = _evaluate_run(spec, cfg, out / name / f"seed{seed}-evaluation")
            model = summary["models"][0]
            runs[key] = {"variant": name, "seed": seed, "step": step, "eval": spec["eval"],
                         "buckets": model["buckets"], "within": model["within"], "beyond": model["beyond"],
                         "num_sequences": summary["num_sequences"],
                         "train_s": train_s if train_s is not None else previous.get("train_s")}
            doc["unigram_buckets"] = summary["unigram_buckets"]
            new[key] = runs[key]
            doc = _save_results(doc, plan, out, new)
            runs = doc["runs"]
    return _save_results(doc, plan, out, new)


def summarize_runs(doc: dict, plan: Plan) -> list[dict]:
    """Per variant: (mean, sample std) over seeds of each bucket (:func:`spe.lab.stats.mean_and_std`,
    std NaN for one seed), the growth of the last bucket over the first, and the first bucket
    relative to the reference variant's."""
    rows = []
    for name, spec in plan.variants.items():
        runs = [r for r in doc.get("runs", {}).values() if r["variant"] == name]
        if not runs:
            continue
        nb = min(len(r["buckets"]) for r in runs)
        buckets = [mean_and_std([r["buckets"][i]["ce"] for r in runs]) for i in range(nb)]
        growth = mean_and_std([r["buckets"][nb - 1]["ce"] / r["buckets"][0]["ce"] - 1 for r in runs])
        times = [r["train_s"] for r in runs if r.get("train_s")]
        rows.append({"variant": name, "description": spec["description"], "seeds": sorted(r["seed"] for r in runs),
                     "bucket_edges": [(b["start"], b["end"]) for b in runs[0]["buckets"][:nb]],
                     "buckets": buckets, "growth": growth,
                     "train_s": statistics.median(times) if times else None})
    ref = next((r for r in rows if r["variant"] == plan.reference), None)
    for r in rows:
        r["vs_reference"] = (r["buckets"][0][0] / ref["buckets"][0][0] - 1) if ref else None
    return rows


def results_table(doc: dict, plan: Plan) -> list[str]:
    """The Markdown lines of :func:`summarize_runs`'s table (and the unigram baseline); [] if no runs."""
    rows = summarize_runs(doc, plan)
    if not rows:
        return []
    edges = rows[0]["bucket_edges"]
    ref = f" vs {plan.reference}" if plan.reference else ""
    lines = ["| variant | seeds | " + " | ".join(f"[{a},{b})" for a, b in edges) + f" | growth | [0,{edges[0][1]})"
             f"{ref} | train s | description |",
             "|---|---|" + "---|" * len(edges) + "---|---|---|---|"]
    for r in rows:
        cells = " | ".join(format_mean_std(m, s, digits=3) for m, s in r["buckets"])
        g, gs = r["growth"]
        growth = format_mean_std(100 * g, 100 * gs, digits=1, signed=True) + " %"
        vs = "" if r["vs_reference"] is None else f"{100 * r['vs_reference']:+.1f}%"
        t = "" if r["train_s"] is None else f"{r['train_s']:.0f}"
        lines.append(f"| {r['variant']} | {len(r['seeds'])} | {cells} | {growth} | {vs} | {t} | {r['description']} |")
    uni = doc.get("unigram_buckets")
    if uni:
        lines += ["", "Unigram baseline: " + ", ".join(f"[{b['start']},{b['end']}) {b['ce']:.3f}" for b in uni) + "."]
    return lines


def write_results(doc: dict, plan: Plan, path: Path) -> None:
    """Writes the Markdown table of :func:`summarize_runs` (nothing before the first run)."""
    table = results_table(doc, plan)
    if not table:
        return
    lines = [f"# {doc.get('title', 'sweep')}", "",
             (f"Data: {doc.get('data')}. Teacher-forced cross-entropy (nats/token) by position bucket, "
              f"{SEED_SPREAD}; growth = last bucket / first bucket − 1 (per seed, then averaged)."), "", *table]
    atomic_write(path, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))


"""``spe sweep``: train and evaluate several variants × seeds from one plan file, resumably.

A plan is a TOML file: top-level keys are training options shared by every variant (on top
of the packaged demo config), ``[model]`` shared model options, and one
``[variants.NAME]`` table per variant with its own training keys, a ``model`` table and
optionally an ``eval`` table (``num_realizations``, ``num_draws``; ``max_length`` and
``bucket_width``, by default 3× and 1× the variant's training length; ``window``, the sliding
attention window at test time, 0 for the whole past) and ``description``.
A variant with ``checkpoints_of = "OTHER"`` trains nothing and re-evaluates OTHER's
checkpoints with its own ``eval`` options (test-time levers cost no training).

Every finished run is skipped when the sweep is started again, an interrupted one resumes,
and ``OUT/results.json`` / ``OUT/results.md`` are rewritten (atomically) after every run,
so nothing is lost when a sweep is stopped.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

log = logging.getLogger("spe")

__all__ = ["Plan", "load_plan", "results_table", "run_sweep", "summarize", "write_results"]

_EVAL_KEYS = ("num_realizations", "num_draws", "max_length", "bucket_width", "window")


@dataclass
class Plan:
    """A parsed plan: merged training configs per variant, evaluation options, seeds."""

    path: str
    title: str
    seeds: list[int]
    reference: str | None
    variants: dict[str, dict] = field(default_factory=dict)  # name -> {"train", "eval", "description", "of"}


def _packaged(name: str) -> Path:
    return Path(str(resources.files("spe") / "configs" / f"{name}.toml"))


def load_plan(path_or_name: str) -> Plan:
    """Reads a plan file (or the name of a packaged one, e.g. ``ablation``).

    Raises:
        ValueError: naming the file and the variant, on a missing file, invalid TOML, an
            unknown option or an invalid value.
    """
    from spe.train.config import TrainConfig, load_config_file

    path = Path(path_or_name)
    if not path.is_file() and _packaged(path_or_name).is_file():
        path = _packaged(path_or_name)
    if not path.is_file():
        raise ValueError(f"plan {path_or_name} is neither a file nor a packaged plan")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"plan {path} is not valid TOML: {err}") from None
    variants = raw.pop("variants", None)
    if not variants:
        raise ValueError(f"plan {path} has no [variants.NAME] tables")
    title = raw.pop("title", path.stem)
    seeds = raw.pop("seeds", [0, 1, 2])
    reference = raw.pop("reference", None)
    if reference is not None and reference not in variants:
        raise ValueError(f"plan {path}: reference {reference!r} is not one of its variants ({', '.join(variants)})")
    base = load_config_file(_packaged("demo"))
    base_model = {**base.pop("model", {}), **raw.pop("model", {})}
    base.update(raw)
    plan = Plan(path=str(path), title=title, seeds=[int(s) for s in seeds], reference=reference)
    for name, spec in variants.items():
        spec = dict(spec)
        of = spec.pop("checkpoints_of", None)
        if of is not None and (of not in variants or variants[of].get("checkpoints_of")):
            raise ValueError(f"plan {path}, variant {name!r}: checkpoints_of must name a variant that trains")
        evaluation = spec.pop("eval", {})
        unknown = set(evaluation) - set(_EVAL_KEYS)
        if unknown:
            raise ValueError(f"plan {path}, variant {name!r}: unknown eval option(s) {sorted(unknown)}; "
                             f"known: {', '.join(_EVAL_KEYS)}")
        for key, value in evaluation.items():
            low = 0 if key == "window" else 1  # window 0: the whole past
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"plan {path}, variant {name!r}: eval option {key} must be an integer ≥ {low}, "
                                 f"got {value!r}")
        description = spec.pop("description", "")
        train = {**base, **spec, "model": {**base_model, **spec.pop("model", {})}}
        try:
            TrainConfig.from_dict(train)
        except (TypeError, ValueError) as err:
            raise ValueError(f"plan {path}, variant {name!r}: {err}") from None
        plan.variants[name] = {"train": train, "eval": evaluation, "description": description, "of": of}
    return plan


def run_sweep(plan: Plan, out: Path, *, seeds: list[int] | None = None, only: list[str] | None = None,
              data: str | None = None, cache_dir: str | None = None, steps: int | None = None,
              progress: bool = True) -> dict:
    """Trains and evaluates every (variant, seed) of the plan; returns the results document.

    Args:
        plan: from :func:`load_plan`.
        out: sweep folder; run ``NAME/seedS`` lives under it.
        seeds: overrides the plan's seeds.
        only: variants to run (default all); those whose checkpoints they reuse are added.
        data: training data for every variant (default: each variant's, i.e. the Bach default).
        cache_dir: converted MIDI and token caches.
        steps: overrides every variant's optimizer steps.
        progress: progress bars.

    Raises:
        ValueError: on an unknown variant name in ``only``.
    """
    from spe.checkpoint import MODEL_FILE, atomic_write, load_metadata
    from spe.cli.main import evaluate_checkpoints
    from spe.train.config import TrainConfig
    from spe.train.loop import train

    names = list(plan.variants)
    if only:
        unknown = set(only) - set(names)
        if unknown:
            raise ValueError(f"unknown variant(s) {sorted(unknown)} in plan {plan.path}; known: {', '.join(names)}")
        wanted = set(only) | {plan.variants[n]["of"] for n in only if plan.variants[n]["of"]}
        names = [n for n in names if n in wanted]
    seeds = seeds or plan.seeds
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    doc = json.loads(results_path.read_text()) if results_path.exists() else {}
    doc.update(title=plan.title, plan=plan.path, reference=plan.reference, data=data or "Bach chorales (music21)")
    runs = doc.setdefault("runs", {})
    # Seed by seed, so that a stopped sweep has every variant at the first seeds; within a
    # seed, variants that train come first, so that re-evaluations find their checkpoints.
    order = sorted(names, key=lambda n: plan.variants[n]["of"] is not None)
    for seed in seeds:
        for name in order:
            spec = plan.variants[name]
            key = f"{name}/seed{seed}"
            source = spec["of"] or name
            run_dir = out / source / f"seed{seed}"
            raw = {**plan.variants[source]["train"], "seed": seed, "out": str(run_dir)}
            if data is not None:
                raw["data"] = data
            if cache_dir is not None:
                raw["cache_dir"] = cache_dir
            if steps is not None:
                raw["steps"] = steps
            cfg = TrainConfig.from_dict(raw)
            train_s = None
            if (run_dir / MODEL_FILE).exists():
                stored = load_metadata(run_dir).get("train", {}).get("model")
                if stored is not None and {**stored, "vocab_size": None} != {**cfg.model, "vocab_size": None}:
                    raise ValueError(f"{run_dir} was trained with model options {stored}, but variant {source!r} "
                                     f"now asks for {cfg.model}: use another --out or delete that run")
            if spec["of"] is None:
                finished = (run_dir / MODEL_FILE).exists() and load_metadata(run_dir).get("step") == cfg.steps
                if not finished:
                    t = time.perf_counter()
                    log.info("sweep: training %s (%d steps)", key, cfg.steps)
                    train(cfg, resume=(run_dir / "train_state.pt").exists(), progress=progress)
                    train_s = time.perf_counter() - t
            elif not (run_dir / MODEL_FILE).exists():
                raise ValueError(f"variant {name!r} re-evaluates {source!r}, whose run {run_dir} does not exist")
            step = load_metadata(run_dir).get("step")
            previous = runs.get(key, {})
            if previous.get("step") == step and previous.get("eval") == spec["eval"] and "buckets" in previous:
                continue
            summary = evaluate_checkpoints([str(run_dir)], out / name / f"seed{seed}-evaluation",
                                           max_length=spec["eval"].get("max_length", 3 * cfg.seq_len), data=cfg.data, cache_dir=cfg.cache_dir,
                                           batch_size=8, device=cfg.device, json_path=None, progress=False,
                                           num_realizations=spec["eval"].get("num_realizations"),
                                           num_draws=spec["eval"].get("num_draws", 1),
                                           bucket_width=spec["eval"].get("bucket_width"),
                                           window=spec["eval"].get("window"))
            model = summary["models"][0]
            runs[key] = {"variant": name, "seed": seed, "step": step, "eval": spec["eval"],
                         "buckets": model["buckets"], "within": model["within"], "beyond": model["beyond"],
                         "num_sequences": summary["num_sequences"],
                         "train_s": train_s if train_s is not None else previous.get("train_s")}
            doc["unigram_buckets"] = summary["unigram_buckets"]
            atomic_write(results_path, lambda tmp: Path(tmp).write_text(json.dumps(doc, indent=2)))
            write_results(doc, plan, out / "results.md")
    atomic_write(results_path, lambda tmp: Path(tmp).write_text(json.dumps(doc, indent=2)))
    write_results(doc, plan, out / "results.md")
    return doc


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else math.nan)


def summarize(doc: dict, plan: Plan) -> list[dict]:
    """Per variant: mean ± std over seeds of each bucket, the growth of the last bucket over
    the first, and the first bucket relative to the reference variant's."""
    rows = []
    for name, spec in plan.variants.items():
        runs = [r for r in doc.get("runs", {}).values() if r["variant"] == name]
        if not runs:
            continue
        nb = min(len(r["buckets"]) for r in runs)
        buckets = [_mean_std([r["buckets"][i]["ce"] for r in runs]) for i in range(nb)]
        growth = _mean_std([r["buckets"][nb - 1]["ce"] / r["buckets"][0]["ce"] - 1 for r in runs])
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
    """The Markdown lines of :func:`summarize`'s table (and the unigram baseline); [] if no runs."""
    rows = summarize(doc, plan)
    if not rows:
        return []
    edges = rows[0]["bucket_edges"]
    ref = f" vs {plan.reference}" if plan.reference else ""
    lines = ["| variant | seeds | " + " | ".join(f"[{a},{b})" for a, b in edges) + f" | growth | [0,{edges[0][1]})"
             f"{ref} | train s | description |",
             "|---|---|" + "---|" * len(edges) + "---|---|---|---|"]
    for r in rows:
        cells = " | ".join(f"{m:.3f} ± {s:.3f}" if not math.isnan(s) else f"{m:.3f}" for m, s in r["buckets"])
        g, gs = r["growth"]
        growth = f"{100 * g:+.1f}%" + ("" if math.isnan(gs) else f" ± {100 * gs:.1f}")
        vs = "" if r["vs_reference"] is None else f"{100 * r['vs_reference']:+.1f}%"
        t = "" if r["train_s"] is None else f"{r['train_s']:.0f}"
        lines.append(f"| {r['variant']} | {len(r['seeds'])} | {cells} | {growth} | {vs} | {t} | {r['description']} |")
    uni = doc.get("unigram_buckets")
    if uni:
        lines += ["", "Unigram baseline: " + ", ".join(f"[{b['start']},{b['end']}) {b['ce']:.3f}" for b in uni) + "."]
    return lines


def write_results(doc: dict, plan: Plan, path: Path) -> None:
    """Writes the Markdown table of :func:`summarize`."""
    from spe.checkpoint import atomic_write

    table = results_table(doc, plan)
    if not table:
        return
    lines = [f"# {doc.get('title', 'sweep')}", "",
             (f"Data: {doc.get('data')}. Teacher-forced cross-entropy (nats/token) by position bucket, mean ± std "
              "over seeds; growth = last bucket / first bucket − 1 (per seed, then averaged)."), "", *table]
    atomic_write(path, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))

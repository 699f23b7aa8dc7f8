"""Plans of rows (variants) × seeds, trained and evaluated resumably (``spe sweep``), on :mod:`spe.lab.plans`.

A plan is a TOML file: top-level keys are training options shared by every variant (on top
of the packaged demo config), ``[model]`` shared model options, ``[eval]`` shared evaluation
options, and one
``[rows.NAME]`` table per row (a variant; ``[variants.NAME]``, its old name, is read as it) with its own training keys, a ``model`` table and
optionally an ``eval`` table (``num_realizations``, ``num_draws``; ``max_length`` and
``bucket_width``, by default 3× and 1× the variant's training length; ``window``, the sliding
attention window at test time, 0 for the whole past; ``split``, the pieces evaluated, as
``spe evaluate --split``: ``test`` with ``test_min_tokens`` = 16 L + 1 is the 16× protocol, and
then ``max_length`` defaults to 16 L) and ``description``.
A variant with ``checkpoints_of = "OTHER"`` trains nothing and re-evaluates OTHER's
checkpoints with its own ``eval`` options (test-time levers cost no training).
Model defaults are those of :class:`~spe.lab.music.TrainConfig` (e.g. a window of the training
length for SPE models), so a variant builds the model ``spe train`` builds from the same options.

Run (VARIANT, S) trains in ``OUT/VARIANT/seedS`` (a re-evaluation: in OTHER's), is evaluated
into ``OUT/VARIANT/seedS-evaluation`` and stores its record in ``OUT/VARIANT/seedS/result.json``:
the eval split's ``buckets`` (``ce`` per bucket), ``within``, ``beyond``, ``num_sequences``,
the model's ``params`` and its ``train_tokens`` (steps × batch × L); a variant evaluated on the
``test`` split also gets its ``validation`` split in the same buckets (``{"max_length",
"num_sequences", "buckets"}``, evaluated into ``seedS-evaluation-validation``): the split a
study selects on (:mod:`spe.lab.study_rules`), the test split being only reported.
A stored record is kept while its checkpoint step and eval options are the plan's (and, on the
test split, it holds the validation buckets); otherwise the run resumes
(:func:`~spe.lab.music.status.run_status` decides) and is evaluated again.
``OUT/results.json`` / ``OUT/results.md`` are rebuilt from the records after every run, so
nothing is lost when a sweep is stopped and sweeps side by side on one folder (``--only``
lists) keep each other's runs.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import fields
from pathlib import Path

from spe.checkpoint import load
from spe.lab import plans
from spe.lab.music.split import SPLITS, split_of_run
from spe.lab.music.evaluation.checkpoints import evaluate_checkpoints, evaluate_models, write_evaluation
from spe.lab.labels import run_label
from spe.lab.plans import Column, markdown_table
from spe.lab.stats import SEED_SPREAD, format_mean_std
from spe.lab.music.config import TrainConfig, load_config_file, packaged_config
from spe.lab.music.train import train
from spe.lab.engine.run_folder import run_lock
from spe.lab.music.status import run_status
from spe.models.config import decode_window

log = logging.getLogger(__name__)

__all__ = ["SWEEP_FORMAT", "MusicPlans", "Plan", "results_markdown", "results_table", "summarize_runs",
           "variant_config", "variant_label"]

EVAL_KEYS = ("num_realizations", "num_draws", "max_length", "bucket_width", "window", "split")
DEFAULT_DATA = "Bach chorales (music21)"


class Plan(plans.Plan):
    """A sweep plan (:class:`spe.lab.plans.Plan`) whose rows are its variants: name -> ``{"train":
    options, "eval": options, "description": str, "of": name of the variant whose checkpoints it
    re-evaluates, or None}``."""

    @property
    def variants(self) -> dict[str, dict]:
        return self.rows


def _check_eval(evaluation: dict) -> None:
    unknown = set(evaluation) - set(EVAL_KEYS)
    if unknown:
        raise ValueError(f"unknown eval option(s) {sorted(unknown)}; known: {', '.join(EVAL_KEYS)}")
    for key, value in evaluation.items():
        if key == "window":
            decode_window(value, "eval option window")
        elif key == "split":
            if value not in SPLITS:
                raise ValueError(f"eval option split must be one of {', '.join(SPLITS)}, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"eval option {key} must be an integer ≥ 1, got {value!r}")


def _settings(top: dict) -> dict:
    """Every variant's training, model and eval options: the demo config's under the plan's."""
    base = load_config_file(packaged_config("demo"))
    model = {**base.pop("model", {}), **plans.option_table(top.pop("model", {}), "model")}
    evaluation = plans.option_table(top.pop("eval", {}), "eval")
    return {"train": {**base, **top}, "model": model, "eval": evaluation}


def _variant(spec: dict, settings: dict) -> dict:
    of = spec.pop("checkpoints_of", None)
    evaluation = {**settings["eval"], **plans.option_table(spec.pop("eval", {}), "eval")}
    _check_eval(evaluation)
    own_model = plans.option_table(spec.pop("model", {}), "model")
    train_options = {**settings["train"], **spec, "model": {**settings["model"], **own_model}}
    TrainConfig.from_dict(train_options)
    return {"train": train_options, "eval": evaluation, "of": of}


def _check_plan(plan: Plan) -> None:
    """Between variants: re-evaluations name a training variant; a test split exists to evaluate."""
    for name, spec in plan.rows.items():
        source = spec["of"] or name
        if spec["of"] is not None and (source not in plan.rows or plan.rows[source]["of"] is not None):
            raise ValueError(f"{plan.where(name)}: checkpoints_of must name a row that trains")
        if spec["eval"].get("split") == "test" and not plan.rows[source]["train"].get("test_min_tokens"):
            raise ValueError(f"{plan.where(name)}: eval option split = \"test\" needs the training "
                             f"option test_min_tokens (e.g. 16 × seq_len + 1) in row {source!r}, "
                             "whose runs hold no test split otherwise")


SWEEP_FORMAT = plans.PlanFormat(
    kind="plan", rows_key="rows", row_word="row", old_rows_key="variants", folder="music/configs", not_plans=("demo",),
    top_keys=("model", "eval", *(f.name for f in fields(TrainConfig) if f.name != "model")),
    settings=_settings, row=_variant, check=_check_plan, plan_class=Plan, task="music")


def variant_config(plan: Plan, name: str, seed: int, out: Path, *, data: str | None = None,
                   cache_dir: str | None = None, steps: int | None = None,
                   threads: int | None = None) -> TrainConfig:
    """The training configuration of (variant, seed): its run folder is ``out/SOURCE/seedS``,
    SOURCE being the variant whose checkpoints it uses. ``data``, ``cache_dir``, ``steps``
    and ``threads`` (CPU threads; 0: PyTorch's default) override the plan's when given."""
    source = plan.rows[name]["of"] or name
    raw = {**plan.rows[source]["train"], "seed": seed, "out": str(plans.run_folder(out, source, seed))}
    for key, value in (("data", data), ("cache_dir", cache_dir), ("steps", steps), ("threads", threads)):
        if value is not None:
            raw[key] = value
    return TrainConfig.from_dict(raw)


def variant_label(plan: Plan, name: str) -> str:
    """The run label (:func:`spe.lab.labels.run_label`) of the model a variant evaluates: its
    source's model options, with the variant's test-time window (eval option ``window``)."""
    spec = plan.rows[name]
    model = dict(TrainConfig.from_dict(plan.rows[spec["of"] or name]["train"]).model)
    if "window" in spec["eval"]:
        model["attention_window"] = decode_window(spec["eval"]["window"], "eval option window")
    return run_label(model)


def _selected(plan: Plan, only: list[str] | None) -> list[str]:
    """Variants to run, training ones first (re-evaluations then find their checkpoints)."""
    names = plans.select_rows(plan, only)
    if only:
        wanted = set(names) | {plan.rows[n]["of"] for n in names if plan.rows[n]["of"]}
        names = [n for n in plan.rows if n in wanted]
    return sorted(names, key=lambda n: plan.rows[n]["of"] is not None)


def _status(plan: Plan, name: str, cfg: TrainConfig):
    """The run status of ``cfg``'s folder; refuses one trained with other options."""
    status = run_status(cfg)
    if status.state != "new" and status.differences:
        raise ValueError(f"{status.out} was trained with model options or data that variant "
                         f"{plan.rows[name]['of'] or name!r} no longer asks for: {status.describe()}; "
                         "use another --out or delete that run")
    return status


def _train_run(plan: Plan, name: str, cfg: TrainConfig, progress: bool) -> float | None:
    """Trains (or resumes) the run of ``cfg`` unless finished; returns the training time in s (None if skipped)."""
    spec = plan.rows[name]
    status = _status(plan, name, cfg)
    if spec["of"] is not None:
        if status.state == "new":
            raise ValueError(f"row {name!r} re-evaluates {spec['of']!r}, whose run {status.out} does not exist")
        return None
    if status.state == "finished":
        return None
    t = time.perf_counter()
    log.info("sweep: training %s/seed%d, %s (%d steps)", name, cfg.seed, variant_label(plan, name), cfg.steps)
    train(cfg, resume=status.state == "resume", progress=progress)
    return time.perf_counter() - t


def _evaluate_run(spec: dict, cfg: TrainConfig, out: Path) -> tuple[dict, dict | None, int]:
    """The run's checkpoint on its validation split (or the eval option ``split``) with the variant's
    eval options; ``max_length`` defaults as in :func:`~spe.lab.music.evaluation.checkpoints.evaluate_models`.

    Returns:
        (the eval split's summary, the validation split's when the eval split is ``test`` (else
        None; :func:`_evaluate_validation`), the model's parameter count).
    """
    options = spec["eval"]
    loaded = load(cfg.out, device=cfg.device)
    summary = evaluate_checkpoints([loaded], out, max_length=options.get("max_length"), split=options.get("split"),
                                   data=cfg.data, cache_dir=cfg.cache_dir, batch_size=8, device=cfg.device,
                                   json_path=None, progress=False, num_realizations=options.get("num_realizations"),
                                   num_draws=options.get("num_draws", 1), bucket_width=options.get("bucket_width"),
                                   window=options.get("window"))
    validation = None
    if options.get("split") == "test":
        validation = _evaluate_validation(loaded, cfg, options, summary["max_length"],
                                          out.with_name(out.name + "-validation"))
    return summary, validation, sum(p.numel() for p in loaded.model.parameters())


def _evaluate_validation(loaded, cfg: TrainConfig, options: dict, length: int, out: Path) -> dict:
    """The validation split in the test split's buckets: the split a study selects on
    (:data:`spe.lab.study_rules.SELECTION_SPLIT`), the test split being only reported.

    The first ``length`` positions of every validation piece that long; where none is, the
    longest whole number of buckets some piece has (logged). Returns ``{"max_length",
    "num_sequences", "buckets"}``; ``buckets`` is empty when no piece holds one bucket.
    """
    width = options.get("bucket_width") or loaded.seq_len
    pieces = split_of_run(loaded.train_config, data=cfg.data, cache_dir=cfg.cache_dir,
                          tokenizer_json=loaded.tokenizer_json, split="validation")
    longest = max((len(p) for p in pieces.val_pieces), default=0)
    reach = min(length, (longest - 1) // width * width)
    if reach < length:
        log.warning("sweep: no validation piece of %s has %d tokens; its validation buckets stop at %d positions",
                    cfg.out, length + 1, reach)
    if reach <= 0:
        return {"max_length": 0, "num_sequences": 0, "buckets": []}
    summary = evaluate_models([loaded], pieces, max_length=reach, batch_size=8,
                              num_realizations=options.get("num_realizations"),
                              num_draws=options.get("num_draws", 1), bucket_width=width)
    write_evaluation(summary, out)
    return {"max_length": reach, "num_sequences": summary["num_sequences"], "buckets": summary["models"][0]["buckets"]}


def _adopt_records(plan: Plan, out: Path) -> None:
    """Stores, as its run's result, each record of an ``OUT/results.json`` written before runs held
    their own (every run was recorded there only): such a sweep resumes and keeps its numbers."""
    path = out / "results.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    for record in doc.get("runs", {}).values():
        folder = plans.run_folder(out, record.get("variant", ""), record.get("seed", -1))
        if record.get("variant") in plan.rows and "buckets" in record and plans.read_result(folder) is None:
            folder.mkdir(parents=True, exist_ok=True)
            plans.write_result(folder, {**record, "unigram_buckets": doc.get("unigram_buckets")})


def summarize_runs(doc: dict, plan: Plan) -> list[dict]:
    """Per variant with runs in ``doc`` (a ``results.json``): the (mean, sample std) over seeds of
    each bucket (:func:`spe.lab.plans.summarize`, std NaN for one seed), the growth of the last
    bucket over the first, the median training time, the first bucket relative to the
    reference variant's and the model's ``run`` label (:func:`variant_label`)."""
    by_variant: dict[str, dict[int, dict]] = {}
    for record in doc.get("runs", {}).values():
        by_variant.setdefault(record["variant"], {})[record["seed"]] = record
    rows = []
    for name, spec in plan.rows.items():
        runs = dict(sorted(by_variant.get(name, {}).items()))
        if not runs:
            continue
        first = next(iter(runs.values()))
        nb = min(len(r["buckets"]) for r in runs.values())
        metrics = {f"bucket{i}": (lambda r, i=i: r["buckets"][i]["ce"]) for i in range(nb)}
        metrics["growth"] = lambda r: r["buckets"][nb - 1]["ce"] / r["buckets"][0]["ce"] - 1
        summary = plans.summarize(runs, metrics)
        times = [r["train_s"] for r in runs.values() if r.get("train_s")]
        rows.append({"variant": name, "run": variant_label(plan, name), "description": spec["description"],
                     "seeds": summary["seeds"],
                     "bucket_edges": [(b["start"], b["end"]) for b in first["buckets"][:nb]],
                     "buckets": [summary[f"bucket{i}"] for i in range(nb)], "growth": summary["growth"],
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
    columns = [Column("variant", cell=lambda r: r["variant"]), Column("run", cell=lambda r: r["run"]),
               Column("seeds", cell=lambda r: str(len(r["seeds"]))),
               *(Column(f"[{a},{b})", cell=lambda r, i=i: format_mean_std(*r["buckets"][i], digits=3))
                 for i, (a, b) in enumerate(edges)),
               Column("growth", cell=lambda r: format_mean_std(100 * r["growth"][0], 100 * r["growth"][1], digits=1,
                                                               signed=True) + " %"),
               Column(f"[0,{edges[0][1]}){ref}",
                      cell=lambda r: "" if r["vs_reference"] is None else f"{100 * r['vs_reference']:+.1f}%"),
               Column("train s", cell=lambda r: "" if r["train_s"] is None else f"{r['train_s']:.0f}"),
               Column("description", cell=lambda r: r["description"])]
    lines = markdown_table(rows, columns)
    uni = doc.get("unigram_buckets")
    if uni:
        lines += ["", "Unigram baseline: " + ", ".join(f"[{b['start']},{b['end']}) {b['ce']:.3f}" for b in uni) + "."]
    return lines


def results_markdown(doc: dict, plan: Plan) -> str | None:
    """The results page: title, what the cells are, :func:`results_table` (None before the first run)."""
    table = results_table(doc, plan)
    if not table:
        return None
    lines = [f"# {doc.get('title', 'sweep')}", "",
             (f"Data: {doc.get('data')}. Teacher-forced cross-entropy (nats/token) by position bucket, "
              f"{SEED_SPREAD}; growth = last bucket / first bucket − 1 (per seed, then averaged)."), "", *table]
    return "\n".join(lines) + "\n"


class MusicPlans(plans.PlanTask):
    """The music language model's plans (``spe sweep``, :mod:`spe.lab.plans`): each (variant, seed)
    trained (or re-evaluated) and evaluated as the module docstring says.

    Run options: ``data``, ``cache_dir``, ``steps`` and ``threads`` (CPU threads; 0: PyTorch's
    default) override every variant's."""

    name = "music"
    format = SWEEP_FORMAT
    run_options = ("data", "cache_dir", "steps", "threads")

    def select(self, only) -> list[str]:
        return _selected(self.plan, only)

    def open(self, ctx) -> None:
        _adopt_records(self.plan, self.out)

    def train_config(self, name: str, seed: int) -> TrainConfig:
        return variant_config(self.plan, name, seed, self.out, **self.options)

    def config(self, name: str, seed: int) -> dict:
        return {**self.train_config(name, seed).to_dict(), "eval": self.plan.rows[name]["eval"]}

    def current(self, name: str, seed: int, record: dict) -> bool:
        status = _status(self.plan, name, self.train_config(name, seed))
        return (status.state == "finished" and record.get("step") == status.step
                and record.get("eval") == self.plan.rows[name]["eval"] and "buckets" in record
                # a test-split record from before the validation buckets: evaluated again (no training)
                and ("validation" in record or self.plan.rows[name]["eval"].get("split") != "test"))

    def run(self, name: str, seed: int, folder: Path) -> dict:
        cfg, spec = self.train_config(name, seed), self.plan.rows[name]
        with run_lock(cfg.out):  # the training run's status is read and acted on by one runner at a time
            train_s = _train_run(self.plan, name, cfg, self.progress)
        evaluation = self.out / name / f"seed{seed}-evaluation"
        with run_lock(evaluation):
            summary, validation, params = _evaluate_run(spec, cfg, evaluation)
        model, step = summary["models"][0], run_status(cfg).step
        extra = {} if validation is None else {"validation": validation}
        return {"variant": name, "seed": seed, "step": step, "eval": spec["eval"],
                "buckets": model["buckets"], "within": model["within"], "beyond": model["beyond"],
                "num_sequences": summary["num_sequences"], **extra, "params": params,
                "train_tokens": step * cfg.batch_size * cfg.seq_len,
                "train_s": train_s if train_s is not None else (plans.read_result(folder) or {}).get("train_s"),
                "unigram_buckets": summary["unigram_buckets"]}

    def results(self) -> tuple[dict, str | None]:
        """``title``, ``plan``, ``reference``, ``data``, ``runs`` (``VARIANT/seedS`` -> record) and the
        ``unigram_buckets`` baseline; the Markdown table of :func:`results_table` (None before any run)."""
        _adopt_records(self.plan, self.out)
        runs, unigram = {}, None
        for name, by_seed in plans.collect(self.plan, self.out).items():
            for seed, record in by_seed.items():
                unigram = record.pop("unigram_buckets", None) or unigram
                runs[f"{name}/seed{seed}"] = record
        planned = next(iter(self.plan.rows.values()))["train"].get("data")  # a plan may name its data
        doc = {"title": self.plan.title, "plan": self.plan.path, "reference": self.plan.reference,
               "data": self.options.get("data") or planned or DEFAULT_DATA, "runs": runs, "unigram_buckets": unigram}
        return doc, results_markdown(doc, self.plan)

"""A synthetic-task experiment: one configuration over several seeds, and its data written out.

``out/`` holds ``config.json`` (the experiment), ``seed<k>/`` per seed (the engine's run folder:
checkpoints, ``model.safetensors``, ``metrics.jsonl``; ``result.json`` once finished, when the
seed is skipped on a second call, or only tested at the lengths its result lacks when
``eval_lengths`` has grown since) and ``results.json`` / ``results.md`` (accuracy per test
distribution and length: per seed, mean and sample standard deviation over the finished seeds).

A seed's ``result.json``: ``task``, ``seed``, ``steps``, ``train_tokens`` (steps × batch ×
train length), ``params``, ``seconds``, ``val_accuracy`` (final model), ``val_99_step`` (the first
evaluation step whose validation accuracy reached 0.99, or None), ``validation``: length ->
``{"accuracy", "targets"[, "num_pairs"]}`` at every test length other than L (the training
distribution, fresh sequences: what rows are chosen on beyond L, :func:`validate_model`), and
``test``: distribution -> length -> the same cells, accuracy in [0, 1] being the share of the
split's targets whose argmax prediction is exact.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import MISSING, fields
from pathlib import Path

import torch

from spe.checkpoint import atomic_write
from spe.lab import plans
from spe.lab.options import read_json_object, rename_old_names, set_threads
from spe.lab.outputs import check_output_folder
from spe.lab.stats import SEED_SPREAD, format_mean_std, mean_and_std
from spe.lab.synth.config import OLD_NAMES, RUN_ONLY_KEYS, SynthConfig
from spe.lab.synth.data import split_seed
from spe.lab.synth.task import (SynthTask, correct_count, distributions, draw, engine_settings, fixed_split,
                                training_distribution)
from spe.lab.engine import distributed as dist_
from spe.lab.engine import core as engine
from spe.lab.engine.metrics_log import read_records
from spe.lab.engine.run_folder import run_lock
from spe.lab.engine.state import latest_unit

__all__ = ["check_data_folder", "missing_lengths", "open_experiment", "results_markdown", "run_synth", "summarize", "test_model",
           "train_seed", "validate_model", "validation_lengths", "write_data", "write_summary"]

log = logging.getLogger(__name__)

TRAIN_EXAMPLES_WRITTEN = 1024  # --write-data: the first sequences of the training stream


def _cell(cfg: SynthConfig, model, split: str, distribution: str, length: int, device: torch.device,
          ctx: dist_.Distributed | None) -> dict:
    tokens, targets = fixed_split(cfg, split, distribution, length)
    correct, n = correct_count(model, tokens, targets, batch_tokens=cfg.eval_batch_tokens, device=device,
                               precision=cfg.precision, ctx=ctx)
    cell = {"accuracy": correct / n if n else None, "targets": n}
    if cfg.task == "mqar":
        cell["num_pairs"] = n // len(tokens)
    return cell


def validation_lengths(cfg: SynthConfig) -> list[int]:
    """The lengths of ``cfg.eval_lengths`` other than the training length L: where a seed is
    validated beyond ``val_accuracy``'s split at L."""
    return [n for n in cfg.eval_lengths if n != cfg.seq_len]


def validate_model(cfg: SynthConfig, model, device: torch.device, ctx: dist_.Distributed | None = None, *,
                   lengths: list[int] | None = None) -> dict:
    """Length (a string) -> ``{"accuracy", "targets"[, "num_pairs"]}`` of ``model`` (put in eval
    mode here) on the fixed validation split of the training distribution at ``lengths``
    (default :func:`validation_lengths`): as many sequences as a test split of that length,
    drawn from another seed than the test's, so that rows can be chosen beyond L without
    looking at the test split."""
    model.eval()
    return {str(n): _cell(cfg, model, "validation", training_distribution(cfg.task), n, device, ctx)
            for n in (validation_lengths(cfg) if lengths is None else lengths)}


def test_model(cfg: SynthConfig, model, device: torch.device, ctx: dist_.Distributed | None = None, *,
               lengths: list[int] | None = None) -> dict:
    """Distribution -> length (a string, as JSON keys are) -> ``{"accuracy", "targets"[, "num_pairs"]}``
    of ``model`` (put in eval mode here) on the fixed test splits of ``cfg`` at ``lengths``
    (default: every one of ``cfg.eval_lengths``)."""
    model.eval()
    return {distribution: {str(n): _cell(cfg, model, "test", distribution, n, device, ctx)
                           for n in (cfg.eval_lengths if lengths is None else lengths)}
            for distribution in distributions(cfg.task)}


def _missing_tests(cfg: SynthConfig, stored: dict) -> list[int]:
    tested = stored.get("test", {})
    return [n for n in cfg.eval_lengths
            if any(str(n) not in tested.get(distribution, {}) for distribution in distributions(cfg.task))]


def _missing_validation(cfg: SynthConfig, stored: dict) -> list[int]:
    return [n for n in validation_lengths(cfg) if str(n) not in stored.get("validation", {})]


def missing_lengths(cfg: SynthConfig, stored: dict) -> list[int]:
    """The lengths of ``cfg.eval_lengths`` at which a seed's stored result has no test cell in
    some distribution or no validation cell (:func:`validation_lengths`); none for a result that
    answers ``cfg``."""
    missing = {*_missing_tests(cfg, stored), *_missing_validation(cfg, stored)}
    return [n for n in cfg.eval_lengths if n in missing]


def _first_step_at(records: list[dict], level: float) -> int | None:
    return next((r["step"] for r in records if (r.get("val_accuracy") or 0.0) >= level), None)


def train_seed(cfg: SynthConfig, seed: int, folder: str | Path, *, progress: bool = True) -> dict:
    """Trains one seed in ``folder`` (resuming its newest checkpoint), then tests the final model.

    A finished seed (its ``result.json`` written) takes no step: its final model is tested and
    validated where its result lacks a cell (:func:`missing_lengths`) and those cells are added
    to the stored result, the others (``val_accuracy`` at L, the training time) kept as they were.

    Args:
        cfg: the experiment.
        seed: seeds the initialisation, the training stream, the SPE codes.
        folder: the seed's run folder.
        progress: show a tqdm bar.

    Returns:
        The seed's result (see the module docstring).

    Raises:
        ValueError: as :func:`spe.lab.engine.core.run`; for a finished seed of other steps than
            ``cfg.steps`` or without a checkpoint.
    """
    folder = Path(folder)
    stored = plans.read_result(folder)
    if stored is not None:
        # testing another model than the one the stored cells measured would mix two runs in one result
        if stored.get("steps") != cfg.steps:
            raise ValueError(f"{folder} finished at {stored.get('steps')} steps and the experiment now asks "
                             f"{cfg.steps}: test lengths can be added only to a run of the same steps")
        if latest_unit(folder) is None:
            raise ValueError(f"{folder} is finished but holds no checkpoint to test at "
                             f"{missing_lengths(cfg, stored)}; run it again in a new --out")
        tests, checks = _missing_tests(cfg, stored), _missing_validation(cfg, stored)
        log.info("%s is finished: testing %s and validating %s from its final model, without training",
                 folder, tests or "nothing", checks or "nothing")
    with dist_.session("cuda" if str(cfg.device).startswith("cuda") else "cpu") as ctx, run_lock(folder, ctx):
        outcome = engine.run(SynthTask(cfg, label=f"{cfg.task} {folder.parent.name}/{folder.name}"),
                             engine_settings(cfg, seed), folder, resume=True, progress=progress)
        started = time.perf_counter()
        device = dist_.process_device(cfg.device, ctx)
        model = outcome.model.eval()
        if stored is not None:
            added = test_model(cfg, model, device, ctx, lengths=tests)
            test = {d: {**stored.get("test", {}).get(d, {}), **cells} for d, cells in added.items()}
            validation = {**stored.get("validation", {}), **validate_model(cfg, model, device, ctx, lengths=checks)}
            return {**stored, "validation": validation, "test": test}
        at_l = _cell(cfg, model, "validation", training_distribution(cfg.task), cfg.seq_len, device, ctx)
        beyond = validate_model(cfg, model, device, ctx)
        test = test_model(cfg, model, device, ctx)
        records = read_records(folder / engine.METRICS_FILE)
        return {"task": cfg.task, "seed": seed, "steps": cfg.steps,
                "train_tokens": cfg.steps * cfg.batch_size * cfg.seq_len,
                "params": model.num_parameters(), "seconds": outcome.seconds + time.perf_counter() - started,
                "val_accuracy": at_l["accuracy"], "val_99_step": _first_step_at(records, 0.99),
                "validation": beyond, "test": test}


def summarize(cfg: SynthConfig, results: list[dict]) -> dict:
    """Distribution -> length -> ``{"mean", "std", "seeds"}`` of the test accuracy in % over
    ``results`` (std None for one seed)."""
    table = {}
    for distribution in distributions(cfg.task):
        table[distribution] = {}
        for length in map(str, cfg.eval_lengths):
            values = [100 * r["test"][distribution][length]["accuracy"] for r in results
                      if r["test"].get(distribution, {}).get(length, {}).get("accuracy") is not None]
            mean, std = mean_and_std(values) if values else (None, None)
            table[distribution][length] = {"mean": mean, "std": std, "seeds": len(values)}
    return table


def results_markdown(title: str, rows: dict[str, tuple[SynthConfig, list[dict]]]) -> str:
    """One table per test distribution: a line per row (name -> its config and its seeds'
    results), a column per test length, cells mean ± std accuracy in %."""
    lines = [f"# {title}", "", f"Test accuracy (%), {SEED_SPREAD}.", ""]
    first = next(iter(rows.values()), None)
    if first is None:
        return "\n".join(lines) + "\n"
    cfg = first[0]
    for distribution in distributions(cfg.task):
        lines += [f"## {distribution}", "", "| row | seeds | " + " | ".join(f"T = {t}" for t in cfg.eval_lengths)
                  + " |", "|---|---|" + "---|" * len(cfg.eval_lengths)]
        for name, (row_cfg, results) in rows.items():
            cells = summarize(row_cfg, results)[distribution]
            text = [format_mean_std(c["mean"], c["std"]) if c["mean"] is not None else "–"
                    for c in (cells.get(str(t), {"mean": None}) for t in cfg.eval_lengths)]
            lines.append(f"| {name} | {len(results)} | " + " | ".join(text) + " |")
        lines.append("")
    return "\n".join(lines)


def write_summary(out: str | Path, cfg: SynthConfig) -> dict:
    """Writes ``out/results.json`` and ``out/results.md`` (atomically) from every finished seed in
    ``out`` (``seedK/result.json``, by seed), under ``out``'s results lock: runners of disjoint
    seeds on one folder each leave tables that hold every seed finished so far. Returns the JSON's
    content."""
    out = Path(out)
    with plans.results_lock(out):
        results = list(plans.read_results(out).values())
        summary = {"config": cfg.to_dict(), "results": results, "accuracy": summarize(cfg, results)}
        plans.write_results(out, summary, results_markdown(f"{cfg.task}: {cfg.model.get('attention', 'performer')} + "
                                                          f"{cfg.model.get('positional', 'sinespe')}",
                                                          {out.name: (cfg, results)}))
    return summary


EXPERIMENT_FILES = ("config.json", *plans.RESULTS_FILES)  # what an experiment writes in its folder


def open_experiment(out: str | Path, cfg: SynthConfig) -> None:
    """Writes ``out/config.json``, or refuses a folder that holds another experiment (only options
    of ``RUN_ONLY_KEYS`` may differ: a finished seed is not trained again, so other ``steps``
    would stand beside results of the stored ones; ``eval_lengths`` may grow: the stored lengths
    all kept, the file then records the new list and finished seeds are tested at the added
    lengths) or another tool's files (:func:`spe.lab.plans.claim_folder`).

    Raises:
        ValueError: naming the options that differ (both values), or the files.
    """
    out = plans.claim_folder(out, "synth", EXPERIMENT_FILES)
    file = out / "config.json"
    with run_lock(out):
        current = cfg.to_dict()
        if file.is_file():
            defaults = {f.name: f.default for f in fields(SynthConfig) if f.default is not MISSING}
            raw = rename_old_names(read_json_object(file, "an spe synth experiment's config"), OLD_NAMES)
            stored = {**defaults, **raw}
            changed = {k: (stored.get(k), v) for k, v in current.items()
                       if k not in RUN_ONLY_KEYS and stored.get(k) != v}
            grown = set(stored.get("eval_lengths") or ()) <= set(current["eval_lengths"])
            if grown:
                changed.pop("eval_lengths", None)
            if changed:
                detail = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items())
                raise ValueError(f"{out} holds another synthetic-task experiment ({detail}); choose another --out"
                                 + ("" if grown else " (eval_lengths may only grow: keep every stored length)"))
            if stored.get("eval_lengths") == current["eval_lengths"]:
                return
            current = {**raw, "eval_lengths": current["eval_lengths"]}
        atomic_write(file, lambda tmp: Path(tmp).write_text(json.dumps(current, indent=2)))


def run_synth(cfg: SynthConfig, seeds: list[int], out: str | Path, *, threads: int | None = None,
              progress: bool = True) -> dict:
    """Trains and tests ``cfg`` once per seed (``out/seed<k>``; finished seeds are read back,
    interrupted ones resume), then writes ``out/results.json`` and ``results.md`` over every
    seed finished in ``out`` (those of earlier calls too: :func:`write_summary`).

    Raises:
        ValueError: if ``out`` holds another configuration or another tool's files, no seed is
            given, or as :func:`train_seed`.
    """
    if not seeds:
        raise ValueError("give at least one seed")
    set_threads(threads)
    out = Path(out)
    open_experiment(out, cfg)
    for seed in seeds:
        plans.run_once(out / f"seed{seed}", lambda folder, seed=seed: train_seed(cfg, seed, folder, progress=progress),
                       current=lambda stored: not missing_lengths(cfg, stored),
                       config=lambda seed=seed: {**cfg.to_dict(), "seed": seed})
    return write_summary(out, cfg)


def _write_lines(path: Path, batches) -> None:
    """Writes ``path``, one JSON line ``{"tokens", "targets"}`` per sequence of ``batches`` (pairs of
    (B, T) tensors), converting one sequence at a time: the text never exists whole in memory."""
    with open(path, "w") as fh:
        for tokens, targets in batches:
            for a, b in zip(tokens, targets):
                fh.write(json.dumps({"tokens": a.tolist(), "targets": b.tolist()}) + "\n")


def _train_stream(cfg: SynthConfig, seed: int, count: int):
    """The first ``count`` sequences of the training stream of ``seed``, batch by batch."""
    generator = torch.Generator().manual_seed(seed)
    while count > 0:
        tokens, targets = draw(cfg, training_distribution(cfg.task), cfg.seq_len, cfg.batch_size, generator)
        yield tokens[:count], targets[:count]
        count -= len(tokens)


def check_data_folder(folder: str | Path) -> Path:
    """``folder`` as a Path, if it can be :func:`write_data`'s folder.

    Raises:
        ValueError: naming ``--write-data``, if ``folder`` is empty (an unset shell variable), a
            file, or under a file or a folder that cannot be written.
    """
    if not str(folder):
        raise ValueError("--write-data is empty: give a folder (an unset shell variable?)")
    return check_output_folder(folder, "--write-data")


def write_data(cfg: SynthConfig, folder: str | Path, *, seed: int = 0,
               train_examples: int = TRAIN_EXAMPLES_WRITTEN) -> list[Path]:
    """Writes the data a run of ``cfg`` with ``seed`` sees, as JSON lines ``{"tokens", "targets"}``
    (targets −100 where no loss is taken), and ``vocab.json``, under ``folder`` only:

    * ``train.jsonl``: the first ``train_examples`` sequences of the training stream (drawn in
      batches of ``batch_size`` from a generator seeded with ``seed``, as the engine's ``data``
      generator draws them);
    * ``validation.jsonl``: the fixed validation split at the training length, and
      ``validation-T.jsonl`` at each other test length T (:func:`validation_lengths`);
    * ``test-DISTRIBUTION-T.jsonl``: each fixed test split.

    One split at a time is held in memory (the training stream one batch at a time), written a
    sequence at a time. The files are written in a hidden folder beside ``folder`` (inside it,
    if it exists) and moved into place once all are written: a failure leaves nothing behind.

    Returns:
        The files written.

    Raises:
        ValueError: if ``folder`` is empty, a file, or already holds any of these files (nothing is
            written then).
    """
    folder = check_data_folder(folder)
    names = ["vocab.json", "train.jsonl", "validation.jsonl",
             *(f"validation-{t}.jsonl" for t in validation_lengths(cfg)),
             *(f"test-{d}-{t}.jsonl" for d in distributions(cfg.task) for t in cfg.eval_lengths)]
    existing = [n for n in names if (folder / n).exists()]
    if existing:
        raise ValueError(f"{folder} already holds {', '.join(existing)}: remove them or choose another folder")
    training = training_distribution(cfg.task)
    splits = {"train.jsonl": lambda: _train_stream(cfg, seed, train_examples),
              "validation.jsonl": lambda: [fixed_split(cfg, "validation", training, cfg.seq_len)]}
    seeds = {"train": seed, "validation": split_seed(cfg.task, "validation", training, cfg.seq_len,
                                                     cfg.eval_seed)}
    for t in validation_lengths(cfg):
        splits[f"validation-{t}.jsonl"] = lambda t=t: [fixed_split(cfg, "validation", training, t)]
        seeds[f"validation-{t}"] = split_seed(cfg.task, "validation", training, t, cfg.eval_seed)
    for d in distributions(cfg.task):
        for t in cfg.eval_lengths:
            splits[f"test-{d}-{t}.jsonl"] = lambda d=d, t=t: [fixed_split(cfg, "test", d, t)]
            seeds[f"test-{d}-{t}"] = split_seed(cfg.task, "test", d, t, cfg.eval_seed)
    vocab = {"task": cfg.task, "tokens": cfg.vocab(), "ignore_index": -100, "seeds": seeds,
             "options": {k: getattr(cfg, k) for k in ("train_length", "eval_lengths", "eval_examples", "eval_tokens",
                                                      "eval_seed", "batch_size", "p_ignore", "num_pairs",
                                                      "num_keys", "num_values")}}
    if cfg.task == "mqar":
        vocab["pairs"] = {"train": cfg.train_pairs, "more-pairs": {str(t): cfg.pairs_at(t) for t in cfg.eval_lengths},
                          "same-pairs": {str(t): min(cfg.train_pairs, t // 4) for t in cfg.eval_lengths}}
    existed = folder.is_dir()
    home = folder if existed else next(p for p in folder.parents if p.is_dir())
    stage = Path(tempfile.mkdtemp(prefix=f".{folder.name or 'data'}.", suffix=".partial", dir=home))
    try:
        umask = os.umask(0)
        os.umask(umask)
        stage.chmod(0o777 & ~umask)  # mkdtemp's 0700 would become the folder's mode
        (stage / "vocab.json").write_text(json.dumps(vocab, indent=2))
        for name, batches in splits.items():
            _write_lines(stage / name, batches())
        if existed:
            for name in names:
                os.replace(stage / name, folder / name)
            stage.rmdir()
        else:
            folder.parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage, folder)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return [folder / "vocab.json", *(folder / name for name in splits)]

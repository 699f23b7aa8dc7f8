"""An LRA experiment: one configuration over several seeds, summarised as mean ± sample std.

``out/`` holds ``config.json`` (the experiment), ``seed<k>/`` per seed (see
:mod:`spe.lab.lra.train`), ``results.json`` and ``results.md`` (test accuracy per seed, mean and
sample standard deviation over the finished seeds, as :mod:`spe.lab.stats`), and for images
``attention_seed<k>.png``.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import MISSING, fields
from pathlib import Path

import torch

from spe.checkpoint import atomic_write
from spe.lab.lra.config import OLD_NAMES, RUN_ONLY_KEYS, LRAConfig
from spe.lab.lra.train import train_seed
from spe.models.classifier_config import ClassifierConfig
from spe.lab import plans
from spe.lab.options import check_threads, read_json_object, rename_old_names
from spe.lab.stats import SEED_SPREAD, format_mean_std
from spe.lab.engine import distributed as dist_
from spe.lab.engine.run_folder import check_task, run_lock

__all__ = ["attention_map", "default_folder", "load_splits", "open_experiment", "run_lra", "summarize",
           "write_summary"]

log = logging.getLogger(__name__)


def load_splits(cfg: LRAConfig) -> dict:
    """The task's splits as the configuration asks (embedded data when ``cfg.data`` is None).

    Raises:
        FileNotFoundError, ValueError: as :func:`spe.lab.lra.data.load_task`.
    """
    from spe.lab.lra.data.tasks import load_task

    options = dict(cfg.data_options)
    sizes = tuple(options.pop(k, d) for k, d in (("num_train", 96_000), ("num_val", 2_000), ("num_test", 2_000)))
    drop = bool(options.pop("drop_parentheses", False))
    return load_task(cfg.task, cfg.data, max_length=cfg.seq_len, drop_parentheses=drop, listops_sizes=sizes,
                     listops_options=options, listops_pipeline=cfg.listops_pipeline)


def _folder_part(value) -> str:
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return "".join(c if c.isalnum() or c in "._+" else "_" for c in text)


def default_folder(cfg: LRAConfig, model_options: dict | None = None) -> Path:
    """``spe lra``'s default experiment folder: ``runs/lra/PRESET/TASK-ATTENTION-POSITIONAL``, + ``-lra-2021``
    for that ListOps pipeline, + ``-KEY-VALUE`` for each of ``model_options`` (the options given
    beside the preset; decay ``none`` adds nothing, as before the option existed), for a
    ``positional_lr_scale`` other than 1 and a ``feature_redraw_every`` other than 0, sorted by
    key: two settings never share a default folder.
    Characters other than letters, digits and ``._+`` in a value become ``_``."""
    parts = {k: v for k, v in (model_options or {}).items() if not (k == "decay" and v == "none")}
    if cfg.positional_lr_scale != 1.0:
        parts["positional_lr_scale"] = cfg.positional_lr_scale
    if cfg.feature_redraw_every:
        parts["feature_redraw_every"] = cfg.feature_redraw_every
    pipeline = "" if cfg.listops_pipeline == "lossless" else f"-{cfg.listops_pipeline}"
    suffix = "".join(f"-{key}-{_folder_part(parts[key])}" for key in sorted(parts))
    return Path(f"runs/lra/{cfg.preset}/{cfg.task}-{cfg.attention}-{cfg.positional}{pipeline}{suffix}")


def summarize(results: list[dict]) -> dict:
    """Test accuracy in % per seed, their mean and sample standard deviation (n − 1, as
    :func:`spe.lab.plans.summarize`; None for one seed, both None for none)."""
    stats = plans.summarize({r["seed"]: r for r in results}, {"accuracy": lambda r: 100 * r["test_accuracy"]})
    mean, std = stats["accuracy"] or (None, math.nan)
    return {"seeds": stats["seeds"], "test_accuracy": [100 * r["test_accuracy"] for r in results], "mean": mean,
            "std": None if math.isnan(std) else std, "seconds": [r["seconds"] for r in results]}


def _markdown(cfg: LRAConfig, summary: dict, results: list[dict]) -> str:
    lines = [f"# LRA {cfg.task}: {cfg.attention} + {cfg.positional} ({cfg.preset})", "",
             f"Test accuracy {format_mean_std(summary['mean'], summary['std'])} % over {len(results)} seed(s) "
             f"({SEED_SPREAD}).", "",
             "| seed | test accuracy (%) | best val accuracy (%) | best step | steps | wall time (s) |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['seed']} | {100 * r['test_accuracy']:.2f} | {100 * r['val_accuracy']:.2f} | {r['best_step']} "
              f"| {r['steps']} | {r['seconds']:.0f} |" for r in results]
    return "\n".join(lines) + "\n"


def write_summary(out: str | Path, cfg: LRAConfig, results: list[dict]) -> dict:
    """Writes the experiment's ``results.json`` and ``results.md`` (atomically) from its seeds' results;
    returns the summary (``config``, ``results`` and :func:`summarize`'s keys)."""
    out = Path(out)
    summary = {"config": cfg.to_dict(), "results": results, **summarize(results)}
    plans.write_results(out, summary, _markdown(cfg, summary, results))
    return summary


def open_experiment(out: str | Path, cfg: LRAConfig, ctx=None) -> None:
    """Writes ``out/config.json``, or refuses a folder that holds another experiment
    (:func:`_check_config`), under the folder's lock; under ``torchrun`` (``ctx``) rank 0 writes."""
    out = Path(out)
    if ctx is None or ctx.is_main:
        with run_lock(out):  # two runners starting one new experiment: one writes config.json, the other checks it
            _check_config(out, cfg)
    if ctx is not None:
        dist_.barrier(ctx)
        if not ctx.is_main:
            _check_config(out, cfg)


def attention_map(out: str | Path, seed: int, splits: dict, cfg: LRAConfig) -> None:
    """Draws ``out/attention_seed<k>.png`` (once) for image tasks read through the CLS token (not for
    a Fourier mixer, FNet, which has no attention weights)."""
    from spe.attention.fourier import MIXERS

    if cfg.attention in MIXERS:
        return
    if getattr(splits["test"], "grid", None) is not None and cfg.model.get("pooling", "cls") == "cls":
        _attention_map(Path(out), seed, splits["test"], cfg)


def run_lra(cfg: LRAConfig, seeds: list[int], out: str | Path, *, threads: int | None = None,
            progress: bool = True, splits: dict | None = None) -> dict:
    """Trains and tests ``cfg`` once per seed (resumable), then writes the summary.

    Under ``torchrun`` every process calls this with the same arguments: each seed's global
    batch is shared between the processes (``batch_size`` divisible by their number) and
    only rank 0 writes files.

    Args:
        cfg: the experiment.
        seeds: one run per seed (``out/seed<k>``, :func:`spe.lab.plans.run_once`); finished
            seeds are read back, not rerun.
        out: the experiment folder; it must not hold a different configuration.
        threads: torch CPU threads (None or 0: torch's default).
        progress: tqdm bars.
        splits: the task's splits as :func:`load_splits` gives them for ``cfg`` (None: loaded here).

    Returns:
        The summary (``results.json``'s content) over every finished seed of ``out``: the seeds run
        now and those an earlier call finished there.

    Raises:
        ValueError: if ``out`` holds another configuration, or as :func:`load_splits` and
            :func:`~spe.lab.lra.train.train_seed`.
        FileNotFoundError: as :func:`load_splits`.
    """
    if not seeds:
        raise ValueError("give at least one seed")
    check_threads(threads)
    if threads:
        torch.set_num_threads(threads)
    out = Path(out)
    with dist_.session("cuda" if str(cfg.device).startswith("cuda") else "cpu") as ctx:
        # the data first: one refused (an over-long ListOps row …) leaves no config.json behind
        splits = load_splits(cfg) if splits is None else splits
        # before config.json is written; read by every process, so that all of them stop
        for folder, latest in ((out, ""), *((out / f"seed{seed}", "last") for seed in seeds)):
            check_task(folder, latest, "lra")
        open_experiment(out, cfg, ctx)
        log.info("%s: %d seed(s), %d process(es)", out, len(seeds), ctx.world_size)
        results = []
        for seed in seeds:
            results.append(plans.run_once(out / f"seed{seed}", lambda folder, seed=seed: train_seed(
                cfg, splits, seed, folder, progress=progress), ctx=ctx,
                config=lambda seed=seed: {**cfg.to_dict(), "seed": seed}))
            log.info("%s seed %d: test accuracy %.4f", out, seed, results[-1]["test_accuracy"])
            if ctx.is_main:
                attention_map(out, seed, splits, cfg)
        # the folder's summary covers every finished seed: a later --seeds 3,4 adds to 0,1,2, not replaces them
        finished = {**plans.read_results(out), **{seed: result for seed, result in zip(seeds, results)}}
        results = [finished[seed] for seed in sorted(finished)]
        if ctx.is_main:
            summary = write_summary(out, cfg, results)
        else:
            summary = {"config": cfg.to_dict(), "results": results, **summarize(results)}
        dist_.barrier(ctx)
    return summary


def _check_config(out: Path, cfg: LRAConfig) -> None:
    """Writes ``config.json``, or refuses a folder that holds another experiment.

    Options of ``RUN_ONLY_KEYS`` may differ; an option the stored file lacks (written before
    it existed) counts as its default, model options included (a stored model without
    ``fixed_code`` is the same model as one with ``fixed_code = false``).
    """
    file = out / "config.json"
    current = cfg.to_dict()
    if file.is_file():
        defaults = {f.name: f.default for f in fields(LRAConfig) if f.default is not MISSING}
        raw = read_json_object(file, "an spe lra experiment's config")
        stored = {**defaults, **rename_old_names(raw, OLD_NAMES)}  # a folder of before seq_len's rename
        model_defaults = {f.name: f.default for f in fields(ClassifierConfig) if f.default is not MISSING}
        stored["model"] = {**model_defaults, **stored.get("model", {})}
        current = {**current, "model": {**model_defaults, **current.get("model", {})}}
        changed = {k: (stored.get(k), v) for k, v in current.items()
                   if k not in RUN_ONLY_KEYS and stored.get(k) != v}
        if "model" in changed:  # name the model options that differ, not all of them
            a, b = changed["model"]
            keys = sorted(k for k in {*a, *b} if a.get(k) != b.get(k))
            changed["model"] = ({k: a.get(k) for k in keys}, {k: b.get(k) for k in keys})
        if changed:
            detail = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items())
            raise ValueError(f"{out} holds another LRA experiment ({detail}); choose another --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(file, lambda tmp: Path(tmp).write_text(json.dumps(cfg.to_dict(), indent=2)))


def _attention_map(out: Path, seed: int, test, cfg: LRAConfig) -> None:
    from spe.checkpoint import load
    from spe.lab.lra.attention import cls_attention, plot_cls_attention

    png = out / f"attention_seed{seed}.png"
    if png.exists():
        return
    model = load(out / f"seed{seed}" / "best", device=cfg.device).model
    tokens, lengths, labels = test.batch(torch.arange(min(4, len(test))))
    weights = cls_attention(model, tokens.to(cfg.device), lengths.to(cfg.device), layer=-1)
    plot_cls_attention(weights, test.grid, png, images=tokens, title=f"{cfg.attention} + {cfg.positional}")

"""Evaluation of trained checkpoints on the validation split: the numbers and files of ``spe evaluate``.

:func:`evaluate_models` computes per-position cross-entropy of loaded models on validation
sequences (and the unigram baseline); :func:`write_evaluation` writes ``per_position.csv``,
``summary.json`` and ``extrapolation.png``; :func:`evaluate_checkpoints` does both from paths.

Letters: N = validation sequences, T = evaluated positions.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import Tensor

from spe.lab import strict_json
from spe.checkpoint import LoadedCheckpoint, atomic_write, load
from spe.lab.music.split import CorpusSplit, split_of_run, validation_sequences
from spe.lab.labels import run_label
from spe.lab.music.evaluation.extrapolation import bucket_means, per_position_cross_entropy, unigram_cross_entropy
from spe.lab.music.evaluation.memory import check_evaluation_memory, evaluation_bytes, out_of_memory_error
from spe.lab.engine.memory import format_bytes
from spe.lab.outputs import check_output_file, check_output_folder, check_outside_data

__all__ = ["check_tokenizers", "evaluate_checkpoints", "evaluate_models", "model_label", "stored_summary",
           "summary_table", "write_evaluation"]

# Moving-mean width of the curves in extrapolation.png, in positions.
SMOOTHING = 16

# The run's name in tables, legends and summary.json (kept under its older name for callers).
model_label = run_label


def _sequence_std(ce: Tensor) -> float:
    """Standard deviation over sequences of the per-sequence mean of (N, T) values (NaN if N < 2 or T = 0)."""
    if ce.shape[0] < 2 or ce.shape[1] == 0:
        return float("nan")
    return float(ce.mean(1).std())


def _model_row(loaded: LoadedCheckpoint, ce: Tensor, bucket_width: int | None) -> dict:
    seq_len = loaded.seq_len
    return {"checkpoint": loaded.path, "label": run_label(loaded.config), "seq_len": seq_len, "step": loaded.step,
            "within": float(ce[:, :seq_len].mean()), "beyond": float(ce[:, seq_len:].mean()),
            # std over sequences of each sequence's mean (Table 6's ±), as bucket_means does
            "within_std": _sequence_std(ce[:, :seq_len]), "beyond_std": _sequence_std(ce[:, seq_len:]),
            "buckets": bucket_means(ce, bucket_width or seq_len), "per_position": ce.mean(0).tolist()}


def _warn_non_finite(loaded: LoadedCheckpoint, ce: Tensor, width: int) -> None:
    """Warns, naming the model and the buckets, where (N, T) cross-entropies are NaN or ±inf
    (the model's outputs overflowed): their means are NaN, which summary.json writes as null."""
    bad = ~torch.isfinite(ce)
    if not bool(bad.any()):
        return
    length = ce.shape[1]
    starts = sorted({int(t) // width * width for t in bad.any(0).nonzero()})
    buckets = ", ".join(f"{start}–{min(start + width, length)}" for start in starts)
    warnings.warn(f"{loaded.path} ({run_label(loaded.config)}): {int(bad.sum())} of {ce.numel()} cross-entropies "
                  f"are NaN or infinite, in the bucket(s) of positions {buckets}: their means are NaN (null "
                  "in summary.json)", stacklevel=3)


def evaluate_models(checkpoints: list[LoadedCheckpoint], split: CorpusSplit, *, max_length: int | None = None,
                    batch_size: int = 8, num_realizations: int | None = None, num_draws: int = 1,
                    bucket_width: int | None = None, progress: bool = False) -> dict:
    """Teacher-forced cross-entropy of each model on the same validation sequences.

    Args:
        checkpoints: loaded checkpoints (:func:`~spe.checkpoint.load`), at least one.
        split: the corpus split whose validation pieces are evaluated and whose training
            pieces give the unigram baseline.
        max_length: T, evaluated positions (default 3 × the longest training length; on the
            test split, ``split.test_min_tokens`` − 1, the positions every test piece has).
        batch_size: sequences per forward pass.
        num_realizations: SPE realisations R at test time (default: as trained).
        num_draws: SPE codes whose predicted probabilities are averaged.
        bucket_width: positions per bucket (default: each model's training length, so
            models trained at different lengths compare bucket by bucket).
        progress: progress bars.

    Returns:
        ``max_length``, ``split`` (which pieces were evaluated: ``validation``, ``train``,
        ``all``), ``num_sequences``, ``num_validation_pieces`` (evaluated pieces),
        ``unigram`` (nats/token; fitted on ``split.train_pieces``, so in-sample for ``train``
        and ``all``), ``unigram_buckets``, ``unigram_per_position`` (T values) and ``models``: per model
        ``checkpoint``, ``label``, ``seq_len``, ``step``, ``within``/``beyond`` (mean nats/token
        inside and beyond the training length) with ``within_std``/``beyond_std`` (NaN,
        written as null, for fewer than two sequences),
        ``buckets`` and ``per_position`` (T values).

    Raises:
        ValueError: if no checkpoint is given or no validation piece has T + 1 tokens.

    Warns:
        UserWarning: naming the model and the buckets, if a cross-entropy is NaN or infinite.
    """
    if not checkpoints:
        raise ValueError("give at least one checkpoint to evaluate")
    length = max_length or (split.test_min_tokens - 1 if split.evaluated == "test"
                            else 3 * max(c.seq_len for c in checkpoints))
    for loaded in checkpoints:
        loaded.check_length(length, f"--eval-length {length}" if max_length
                            else f"the default length {length}")
    seqs = validation_sequences(split, length)
    batch = max(1, min(batch_size, len(seqs)))
    for loaded in checkpoints:  # every model before the first forward pass
        check_evaluation_memory(loaded.path, loaded.config, length, batch, next(loaded.model.parameters()).device,
                                default=not max_length, num_realizations=num_realizations)
    results = []
    for loaded in checkpoints:
        try:
            ce = per_position_cross_entropy(loaded.model, seqs, batch_size=batch_size,
                                            num_realizations=num_realizations, num_draws=num_draws, progress=progress)
        except (RuntimeError, MemoryError) as err:
            if not out_of_memory_error(err):
                raise
            raise ValueError(f"{loaded.path} ran out of memory at length {length} with {batch} sequence(s) per "
                             "batch (estimated " + format_bytes(evaluation_bytes(loaded.config, length, batch,
                                                                   num_realizations=num_realizations))
                             + "): lower --eval-length or --batch-size") from None
        _warn_non_finite(loaded, ce, bucket_width or loaded.seq_len)
        results.append(_model_row(loaded, ce, bucket_width))
    uni = unigram_cross_entropy(split.train_pieces, seqs, checkpoints[-1].config.vocab_size)
    return {"max_length": length, "split": split.evaluated, "num_sequences": len(seqs),
            "num_validation_pieces": len(split.val_pieces),
            "unigram": float(uni.mean()),
            "unigram_buckets": bucket_means(uni, bucket_width or checkpoints[0].seq_len),
            "unigram_per_position": uni.mean(0).tolist(), "models": results}


def write_evaluation(summary: dict, out: str | os.PathLike, *, json_path: str | os.PathLike | None = None) -> None:
    """Writes ``per_position.csv``, ``summary.json`` (without the per-position curves) and
    ``extrapolation.png`` (if matplotlib is installed) into ``out``; optionally the bucket
    means of every model to ``json_path``.

    Args:
        summary: from :func:`evaluate_models`.
        out: output folder (created).
        json_path: extra JSON of ``{"models": [{label, checkpoint, buckets}], "unigram_buckets"}``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    models = summary["models"]
    unigram = summary["unigram_per_position"]
    lines = ["position," + ",".join(f'"{m["label"]}"' for m in models) + ",unigram"]
    for t in range(summary["max_length"]):
        lines.append(f"{t}," + ",".join(f'{m["per_position"][t]:.5f}' for m in models) + f",{unigram[t]:.5f}")
    atomic_write(out / "per_position.csv", lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    atomic_write(out / "summary.json", lambda tmp: Path(tmp).write_text(strict_json.dumps(
        stored_summary(summary), indent=2)))
    _plot_extrapolation(summary, out / "extrapolation.png")
    if json_path:
        text = strict_json.dumps({"models": [{"label": r["label"], "checkpoint": r["checkpoint"], "buckets": r["buckets"]}
                                             for r in models], "unigram_buckets": summary["unigram_buckets"]}, indent=2)
        atomic_write(json_path, lambda tmp: Path(tmp).write_text(text))


def stored_summary(summary: dict) -> dict:
    """The summary without its per-position curves, as ``summary.json`` and the report store it."""
    return {**{k: v for k, v in summary.items() if k != "unigram_per_position"},
            "models": [{k: v for k, v in m.items() if k != "per_position"} for m in summary["models"]]}


def _plot_extrapolation(summary: dict, png: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    seq_lens = sorted({m["seq_len"] for m in summary["models"]})
    # Beyond 4 training lengths (the 16× protocol) a log axis gives each doubling of the context the
    # same width; it has no 0, so position t is drawn at t + 1, the number of tokens it is given.
    log_x = summary["max_length"] > 4 * seq_lens[0]
    first = 1 if log_x else 0
    for m in summary["models"]:
        curve = _smooth(m["per_position"], SMOOTHING)
        ax.plot(range(first, first + len(curve)), curve, label=m["label"])
    ax.plot(range(first, first + summary["max_length"]), _smooth(summary["unigram_per_position"], SMOOTHING), "k:",
            label="unigram")
    for seq_len in seq_lens:
        ax.axvline(seq_len, color="grey", ls="--", lw=1)
        ax.text(seq_len, ax.get_ylim()[1] * 0.97, " training length", va="top", fontsize=8, color="grey")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens of context (position + 1, log scale)" if log_x else "token position")
    ax.set_ylabel(f"cross-entropy (nats/token, moving mean of {SMOOTHING})")
    ax.set_title(f"Cross-entropy by position ({summary['num_sequences']} sequences of the "
                 f"{summary.get('split', 'validation')} pieces)")
    ax.legend()
    fig.tight_layout()
    atomic_write(png, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving mean over ``window`` values (fewer at the start)."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    c = np.cumsum(np.insert(v, 0, 0.0))
    out = np.empty_like(v)
    for i in range(len(v)):
        lo = max(0, i - window + 1)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out.tolist()


def _check_music_checkpoint(loaded: LoadedCheckpoint) -> None:
    """Raises ValueError, naming the checkpoint and what to use instead, for a model that ``spe synth``
    wrote (its metadata holds the synthetic task's config): its tokens are the task's, not REMI's,
    and no music split exists to evaluate it on."""
    synth = loaded.metadata.get("synth")
    if synth is not None:
        task = synth.get("task", "a synthetic task") if isinstance(synth, dict) else "a synthetic task"
        seed_folder = Path(loaded.path) if Path(loaded.path).is_dir() else Path(loaded.path).parent
        if seed_folder.parent.name == "checkpoints":  # OUT/seedK/checkpoints/step-N/model.safetensors
            seed_folder = seed_folder.parent.parent
        raise ValueError(f"{loaded.path} was written by spe synth ({task}), a task that music evaluation does not "
                         f"apply to: spe synth validates and tests its own rows (run it again with --out "
                         f"{seed_folder.parent} and more --eval-lengths to test the final model at more lengths; "
                         f"{seed_folder.parent / 'results.json'} holds the scores)")


def check_tokenizers(loaded: list[LoadedCheckpoint]) -> None:
    """Raises ValueError, naming both checkpoints, unless every one holds a REMI tokenizer with the
    first one's parameters: the pieces are tokenised once, with the first one's, and another
    tokenizer (other tokenizer options, or a run from before them) would read other ids."""
    from spe.lab.music.corpus import same_tokenizer

    for c in loaded:
        if c.tokenizer_json is None:
            raise ValueError(f"{c.path} holds no tokenizer: it was not trained on music by `spe train`")
        if not same_tokenizer(c.tokenizer_json, loaded[0].tokenizer_json):
            raise ValueError(f"{c.path} was trained with another REMI tokenizer than {loaded[0].path} (other "
                             "--tempos/--time-signatures/--merge-tracks, or an spe from before them): token ids "
                             "would not match; evaluate them separately")


def evaluate_checkpoints(checkpoints: list[str | LoadedCheckpoint], out: str | os.PathLike, *,
                         max_length: int | None, data: str | None, cache_dir: str | None, batch_size: int,
                         device: str, json_path: str | None, progress: bool, num_realizations: int | None = None,
                         num_draws: int = 1, bucket_width: int | None = None, window: int | None = None,
                         split: str | None = None, max_piece_tokens: int | None = None) -> dict:
    """Evaluates checkpoints on the first one's validation split (or ``data``); writes CSV, PNG and JSON.

    Args:
        checkpoints: run folders, ``.safetensors`` files or already loaded checkpoints.
        out: folder for ``per_position.csv``, ``summary.json``, ``extrapolation.png``.
        max_length, batch_size, num_realizations, num_draws, bucket_width, progress: as
            :func:`evaluate_models`.
        data: other data to evaluate on (default: the first checkpoint's training data).
        split: ``validation``, ``train``, ``all`` or ``test`` pieces of the data; default ``validation``
            for the first checkpoint's own training data, ``all`` for other data
            (:func:`spe.lab.music.split.split_of_run`).
        cache_dir: corpus cache (default: the first checkpoint's).
        device: where paths are loaded.
        json_path: see :func:`write_evaluation`.
        window: every model's sliding attention window (None: as trained; else decoded by
            :func:`spe.models.config.decode_window`: 0 is the whole past).
        max_piece_tokens: the longest piece kept, in tokens (None: the first run's; see
            :func:`spe.lab.music.split.split_of_run`).

    Returns:
        :func:`evaluate_models`'s summary.

    Raises:
        FileNotFoundError: if a checkpoint does not exist.
        ValueError: on a bad checkpoint or window, another tokenizer, data too short, or ``out``
            or ``json_path`` in the data folder read.
    """
    sources = [c.path if isinstance(c, LoadedCheckpoint) else c for c in checkpoints]
    check_output_folder(out)
    if json_path:
        check_output_file(json_path, "--json", reads=[*sources, data])
    loaded = [c if isinstance(c, LoadedCheckpoint) else load(c, device=device) for c in checkpoints]
    if not loaded:
        raise ValueError("give at least one checkpoint to evaluate")
    for c in loaded:
        _check_music_checkpoint(c)
    check_tokenizers(loaded)
    for c in loaded:
        c.set_window(window)
    read = data if data is not None else loaded[0].train_config.get("data")  # outputs never among the pieces
    for flag, path in (("--out", out), ("--json", json_path)):
        if path:
            check_outside_data(path, flag, read)
    pieces = split_of_run(loaded[0].train_config, data=data, cache_dir=cache_dir,
                          tokenizer_json=loaded[0].tokenizer_json, split=split, max_piece_tokens=max_piece_tokens)
    summary = evaluate_models(loaded, pieces, max_length=max_length, batch_size=batch_size,
                              num_realizations=num_realizations, num_draws=num_draws, bucket_width=bucket_width,
                              progress=progress)
    write_evaluation(summary, out, json_path=json_path)
    return summary


def summary_table(summary: dict) -> str:
    """:func:`evaluate_models`'s summary as a Markdown table: mean cross-entropy per bucket of
    positions, within and beyond the training length, per model and for the unigram baseline."""
    models, buckets = summary["models"], summary["models"][0]["buckets"]
    lines = ["| model | " + " | ".join(f"[{b['start']},{b['end']})" for b in buckets) + " | within | beyond |",
             "|" + "---|" * (len(buckets) + 3)]
    lines += [f"| {m['label']} | " + " | ".join(f"{b['ce']:.3f}" for b in m["buckets"])
              + f" | {m['within']:.3f} | {m['beyond']:.3f} |" for m in models]
    lines.append("| unigram | " + " | ".join(f"{b['ce']:.3f}" for b in summary["unigram_buckets"])
                 + f" | {summary['unigram']:.3f} | |")
    lines.append(f"({summary['num_sequences']} sequences of {summary['max_length']} positions from the "
                 f"{summary.get('split', 'validation')} pieces; nats per token)")
    return "\n".join(lines)

"""The ``spe`` command: train, evaluate, generate, and the end-to-end demo."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from importlib import resources
from pathlib import Path

__all__ = ["main"]

log = logging.getLogger("spe")

_MODEL_FLAGS = {"positional": "positional", "attention": "attention", "num_realizations": "num_realizations",
                "num_sines": "num_sines", "kernel_size": "kernel_size", "d_model": "d_model",
                "num_layers": "num_layers", "num_heads": "num_heads", "max_distance": "max_distance",
                "max_positions": "max_positions"}

# Encodings that `spe train` gives a sliding window of the training length unless told otherwise.
_WINDOWED_BY_DEFAULT = ("sinespe", "convspe")

_TRAIN_FLAGS = ("data", "cache_dir", "out", "steps", "seq_len", "batch_size", "lr", "seed", "device",
                "eval_every", "threads", "warmup_steps")


class UsageError(ValueError):
    """A command-line mistake, reported without a traceback."""


def _default_config() -> Path:
    return Path(str(resources.files("spe") / "configs" / "demo.toml"))


def _train_config(args: argparse.Namespace):
    from spe.models.config import SCORE_ENCODINGS
    from spe.train.config import TrainConfig, load_config_file

    raw = load_config_file(args.config) if args.config else load_config_file(_default_config())
    model = dict(raw.pop("model", {}))
    for flag in _TRAIN_FLAGS:
        value = getattr(args, flag, None)
        if value is not None:
            raw[flag] = value
    for flag, key in _MODEL_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            model[key] = value
    if getattr(args, "attention_window", None) is not None:
        model["attention_window"] = _window_flag(args.attention_window, "--attention-window")
    if getattr(args, "ungated", False):
        model["gated"] = False
    if getattr(args, "gated", False):
        model["gated"] = True
    if getattr(args, "positional", None) in SCORE_ENCODINGS and getattr(args, "attention", None) is None \
            and model.get("attention", "performer") != "softmax":
        # The config's kernel was not chosen on the command line: pick the one this encoding needs
        # rather than fail (an explicit --attention performer still fails with a clear error).
        log.info("--positional %s acts on attention scores: using softmax attention", args.positional)
        model["attention"] = "softmax"
    if "attention_window" not in model and model.get("positional", "sinespe") in _WINDOWED_BY_DEFAULT:
        # A window of the training length changes nothing inside the trained range and keeps
        # SPE's lags within the trained ones beyond it: on the Bach chorales it cut the growth
        # of cross-entropy from [0,256) to [512,768) from +17 % to +8 % (docs/ablation.md).
        model["attention_window"] = raw.get("seq_len", 256)
        log.info("%s: sliding attention window of %d positions (the training length; --attention-window 0 "
                 "for the whole past)", model.get("positional", "sinespe"), model["attention_window"])
    raw["model"] = model
    return TrainConfig.from_dict(raw)


def _add_train_flags(p: argparse.ArgumentParser, *, with_out: bool = True) -> None:
    p.add_argument("--config", help="TOML file of options (default: the packaged demo config)")
    p.add_argument("--data", help="folder of .mid/.midi files, or music21:NAME for a composer of music21's "
                   "corpus (e.g. music21:palestrina); default: the Bach chorales")
    p.add_argument("--cache-dir", help="cache for converted MIDI and tokens (default ~/.cache/spe)")
    if with_out:
        p.add_argument("--out", help="run folder for checkpoint, logs and plots")
    p.add_argument("--steps", type=int, help="optimizer steps")
    p.add_argument("--seq-len", type=int, help="training length in tokens")
    p.add_argument("--batch-size", type=int, help="crops per step")
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--warmup-steps", type=int, help="linear warmup steps")
    p.add_argument("--eval-every", type=int, help="steps between validation and checkpoints")
    p.add_argument("--positional", help="ape, ape-learned, sinespe, convspe, rope, none; with softmax attention "
                   "also shaw, music-relative, alibi (these select softmax unless --attention is given)")
    p.add_argument("--attention", help="softmax, performer, linear-relu or linear-elu")
    gate = p.add_mutually_exclusive_group()
    gate.add_argument("--gated", action="store_true", help="SPE with gating (eq. 23-25)")
    gate.add_argument("--ungated", action="store_true", help="SPE without gating (the default)")
    p.add_argument("--attention-window", type=int,
                   help="sliding attention window W in positions, kept at test time (0: the whole past; "
                   "default: the training length for sinespe and convspe, the whole past otherwise)")
    p.add_argument("--num-realizations", type=int, help="R, SPE noise realisations")
    p.add_argument("--num-sines", type=int, help="K, sinusoids per feature (sinespe)")
    p.add_argument("--kernel-size", type=int, help="P, filter length (convspe)")
    p.add_argument("--max-distance", type=int, help="clipping distance (shaw) / learned distances (music-relative)")
    p.add_argument("--max-positions", type=int, help="number of learned position embeddings (ape-learned)")
    p.add_argument("--d-model", type=int)
    p.add_argument("--num-layers", type=int)
    p.add_argument("--num-heads", type=int)
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--device", help="cpu or cuda")
    p.add_argument("--threads", type=int, help="CPU threads (0: PyTorch default)")


def cmd_train(args: argparse.Namespace) -> int:
    from spe.train.loop import train

    cfg = _train_config(args)
    out = train(cfg, resume=args.resume, progress=not args.no_progress)
    log.info("checkpoint: %s", out / "model.safetensors")
    return 0


def _validation_sequences(meta: dict, data: str | None, cache_dir: str | None, length: int):
    from spe.data.dataset import prefix_batch
    from spe.data.music import load_corpus, same_tokenizer

    train_cfg = meta.get("train", {})
    data = data if data is not None else train_cfg.get("data")
    corpus = load_corpus(data, cache_dir=cache_dir or train_cfg.get("cache_dir"), progress=False)
    if meta.get("tokenizer") is not None and not same_tokenizer(meta["tokenizer"], corpus.tokenizer_json):
        raise UsageError("the checkpoint's REMI tokenizer differs from this installation's (another MidiTok "
                         "version?): token ids would not match")
    train_idx, val_idx = corpus.split(train_cfg.get("val_fraction", 0.05), train_cfg.get("split_seed", 0))
    val = [corpus.pieces[i] for i in val_idx]
    seqs = prefix_batch(val, length + 1)
    if len(seqs) == 0:
        longest = max(len(p) for p in val)
        raise UsageError(f"no validation piece has {length + 1} tokens (longest: {longest}); lower --max-length")
    return seqs, [corpus.pieces[i] for i in train_idx], len(val)


def _window_flag(value: int, flag: str) -> int | None:
    """A window flag's value: 0 means the whole past (None), W > 0 a window of W."""
    if value < 0:
        raise UsageError(f"{flag} must be 0 (whole past) or a positive number of positions, got {value}")
    return value or None


def _apply_window(model, window: int | None, checkpoint) -> None:
    """--window: None keeps the checkpoint's own, else as :func:`_window_flag`."""
    if window is None:
        return
    window = _window_flag(window, "--window")
    try:
        model.set_attention_window(window)
    except ValueError as err:
        raise UsageError(f"{checkpoint}: {err}") from None


def evaluate_checkpoints(checkpoints: list[str], out: Path, *, max_length: int | None, data: str | None,
                         cache_dir: str | None, batch_size: int, device: str, json_path: str | None,
                         progress: bool, num_realizations: int | None = None, num_draws: int = 1,
                         bucket_width: int | None = None, window: int | None = None) -> dict:
    """Evaluates checkpoints on the validation split; writes CSV, PNG and JSON; returns the summary.

    Buckets are ``bucket_width`` positions wide (default: each checkpoint's training length),
    so that models trained at different lengths can be compared bucket by bucket. ``window``
    sets every model's sliding attention window (0: the whole past; None: as trained).
    """
    from spe.checkpoint import load, load_metadata
    from spe.evaluation.extrapolation import bucket_means, per_position_cross_entropy, unigram_cross_entropy

    metas = [load_metadata(c) for c in checkpoints]
    seq_lens = [m.get("train", {}).get("seq_len", 256) for m in metas]
    length = max_length or 3 * max(seq_lens)
    seqs, train_pieces, n_val = _validation_sequences(metas[0], data, cache_dir, length)
    results = []
    for ckpt, meta, seq_len in zip(checkpoints, metas, seq_lens):
        model = load(ckpt, device=device)
        _apply_window(model, window, ckpt)
        ce = per_position_cross_entropy(model, seqs, batch_size=batch_size, num_realizations=num_realizations,
                                        num_draws=num_draws, progress=progress)
        spe = model.config.positional in ("sinespe", "convspe")
        label = f"{model.config.positional}/{model.config.attention}" + (" gated" if spe and model.config.gated else "")
        if model.config.attention_window is not None:
            label += f" window {model.config.attention_window}"
        results.append({"checkpoint": str(ckpt), "label": label, "seq_len": seq_len, "step": meta.get("step"),
                        "within": float(ce[:, :seq_len].mean()), "beyond": float(ce[:, seq_len:].mean()),
                        # std over sequences of each sequence's mean (Table 6's ±), as bucket_means does
                        "within_std": _sequence_std(ce[:, :seq_len]), "beyond_std": _sequence_std(ce[:, seq_len:]),
                        "buckets": bucket_means(ce, bucket_width or seq_len), "per_position": ce.mean(0).tolist()})
    uni = unigram_cross_entropy(train_pieces, seqs, model.config.vocab_size)
    summary = {"max_length": length, "num_sequences": len(seqs), "num_validation_pieces": n_val,
               "unigram": float(uni.mean()), "unigram_buckets": bucket_means(uni, bucket_width or seq_lens[0]), "models": results}
    out.mkdir(parents=True, exist_ok=True)
    _write_outputs(summary, out, uni.mean(0))
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(
            {"models": [{"label": r["label"], "checkpoint": r["checkpoint"], "buckets": r["buckets"]} for r in results],
             "unigram_buckets": summary["unigram_buckets"]}, indent=2))
    return summary


def _sequence_std(ce) -> float:
    """Standard deviation over sequences of the per-sequence mean of (N, T) values (NaN if N < 2 or T = 0)."""
    if ce.shape[0] < 2 or ce.shape[1] == 0:
        return float("nan")
    return float(ce.mean(1).std())


def _write_outputs(summary: dict, out: Path, unigram_curve) -> None:
    from spe.checkpoint import atomic_write

    models = summary["models"]
    lines = ["position," + ",".join(f'"{m["label"]}"' for m in models) + ",unigram"]
    for t in range(summary["max_length"]):
        lines.append(f"{t}," + ",".join(f'{m["per_position"][t]:.5f}' for m in models) + f",{float(unigram_curve[t]):.5f}")
    atomic_write(out / "per_position.csv", lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    atomic_write(out / "summary.json", lambda tmp: Path(tmp).write_text(json.dumps(
        {**summary, "models": [{k: v for k, v in m.items() if k != "per_position"} for m in models]}, indent=2)))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    window = 16
    for m in models:
        curve = _smooth(m["per_position"], window)
        ax.plot(range(len(curve)), curve, label=m["label"])
    ax.plot(range(summary["max_length"]), _smooth(list(map(float, unigram_curve)), window), "k:", label="unigram")
    for seq_len in sorted({m["seq_len"] for m in models}):
        ax.axvline(seq_len, color="grey", ls="--", lw=1)
        ax.text(seq_len, ax.get_ylim()[1] * 0.97, " training length", va="top", fontsize=8, color="grey")
    ax.set_xlabel("token position")
    ax.set_ylabel(f"cross-entropy (nats/token, moving mean of {window})")
    ax.set_title(f"Validation cross-entropy by position ({summary['num_sequences']} sequences)")
    ax.legend()
    fig.tight_layout()
    atomic_write(out / "extrapolation.png", lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def _smooth(values: list[float], window: int) -> list[float]:
    import numpy as np

    v = np.asarray(values, dtype=float)
    c = np.cumsum(np.insert(v, 0, 0.0))
    out = np.empty_like(v)
    for i in range(len(v)):
        lo = max(0, i - window + 1)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out.tolist()


def _print_summary(summary: dict) -> None:
    models = summary["models"]
    buckets = models[0]["buckets"]
    head = "| model | " + " | ".join(f"[{b['start']},{b['end']})" for b in buckets) + " | within | beyond |"
    print(head)
    print("|" + "---|" * (len(buckets) + 3))
    for m in models:
        print(f"| {m['label']} | " + " | ".join(f"{b['ce']:.3f}" for b in m["buckets"])
              + f" | {m['within']:.3f} | {m['beyond']:.3f} |")
    print("| unigram | " + " | ".join(f"{b['ce']:.3f}" for b in summary["unigram_buckets"])
          + f" | {summary['unigram']:.3f} | |")
    print(f"({summary['num_sequences']} validation sequences of {summary['max_length']} positions; nats per token)")


def cmd_evaluate(args: argparse.Namespace) -> int:
    summary = evaluate_checkpoints(args.checkpoint, Path(args.out), max_length=args.max_length, data=args.data,
                                   cache_dir=args.cache_dir, batch_size=args.batch_size, device=args.device,
                                   json_path=args.json, progress=not args.no_progress,
                                   num_realizations=args.num_realizations, num_draws=args.num_draws,
                                   window=args.window)
    _print_summary(summary)
    log.info("wrote %s", ", ".join(str(Path(args.out) / f) for f in ("per_position.csv", "extrapolation.png", "summary.json")))
    return 0


def generate_midi(checkpoint: str, out: str, *, length: int, prompt: str | None, prompt_bars: int, seed: int,
                  top_p: float, temperature: float, device: str, progress: bool, window: int | None = None) -> dict:
    """Samples a continuation and writes it as MIDI (atomically). Returns facts about it."""
    import torch

    from spe.checkpoint import atomic_write, load, load_metadata
    from spe.data.grammar import REMIGrammar
    from spe.data.music import tokenizer_from_json
    from spe.generation import generate

    if length < 1:
        raise UsageError(f"--length must be a positive number of tokens, got {length}")
    if not out.lower().endswith((".mid", ".midi")):
        raise UsageError(f"--out must name a .mid file, got {out}")
    model = load(checkpoint, device=device)
    _apply_window(model, window, checkpoint)
    meta = load_metadata(checkpoint)
    if "tokenizer" not in meta:
        raise UsageError(f"{checkpoint} holds no tokenizer: it was not trained on music by `spe train`")
    tokenizer = tokenizer_from_json(meta["tokenizer"])
    grammar = REMIGrammar(tokenizer)
    prompt_ids: list[int] = []
    if prompt:
        from symusic import Score

        if not Path(prompt).is_file():
            raise UsageError(f"prompt file {prompt} does not exist")
        try:
            prompt_ids = list(tokenizer.encode(Score(prompt)).ids)
        except Exception as err:  # noqa: BLE001
            raise UsageError(f"cannot read prompt MIDI {prompt}: {err}") from None
        bar_id = tokenizer.vocab["Bar_None"]
        bars = [i for i, t in enumerate(prompt_ids) if t == bar_id]
        if len(bars) > prompt_bars:
            prompt_ids = prompt_ids[:bars[prompt_bars]]
    ids = generate(model, prompt_ids, length, top_p=top_p, temperature=temperature,
                   allowed_next=grammar.allowed_next, generator=torch.Generator().manual_seed(seed),
                   progress=progress)
    score = tokenizer.decode(ids)
    atomic_write(out, lambda tmp: score.dump_midi(tmp))
    beats = score.end() / score.ticks_per_quarter
    return {"out": out, "prompt_tokens": len(prompt_ids), "generated_tokens": length, "total_tokens": len(ids),
            "notes": sum(len(t.notes) for t in score.tracks), "beats": beats,
            "bars": sum(1 for t in ids if t == tokenizer.vocab["Bar_None"]),
            "training_length": load_metadata(checkpoint).get("train", {}).get("seq_len")}


def cmd_generate(args: argparse.Namespace) -> int:
    info = generate_midi(args.checkpoint, args.out, length=args.length, prompt=args.prompt,
                         prompt_bars=args.prompt_bars, seed=args.seed, top_p=args.top_p,
                         temperature=args.temperature, device=args.device, progress=not args.no_progress,
                         window=args.window)
    print(f"wrote {info['out']}: {info['total_tokens']} tokens ({info['prompt_tokens']} from the prompt), "
          f"{info['notes']} notes, {info['bars']} bars, {info['beats']:.1f} beats")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from spe.cli.report import build_report

    if args.probe_tokens < 1:
        raise UsageError(f"--probe-tokens must be positive, got {args.probe_tokens}")
    path = build_report(args.checkpoint, Path(args.out), data=args.data, cache_dir=args.cache_dir,
                        max_length=args.max_length, r_test=_int_list(args.r_test, "--r-test") if args.r_test else (),
                        generate_length=args.length, num_probe_tokens=args.probe_tokens, device=args.device,
                        progress=not args.no_progress)
    print(f"wrote {path}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """train each positional encoding -> evaluate them together -> generate with the first."""
    from spe.checkpoint import MODEL_FILE, load_metadata
    from spe.train.loop import train

    t0 = time.perf_counter()
    out = Path(args.out)
    positionals = [p.strip() for p in args.positionals.split(",") if p.strip()]
    if not positionals:
        raise UsageError("--positionals must name at least one encoding")
    timings, checkpoints = {}, []
    for positional in positionals:
        args.positional = positional
        args.out = None
        cfg = _train_config(args)
        cfg.out = str(out / positional)
        run = Path(cfg.out)
        t = time.perf_counter()
        finished = False
        if (run / MODEL_FILE).exists():
            saved = load_metadata(run)
            if saved.get("train", {}).get("model") != cfg.model or saved.get("train", {}).get("seq_len") != cfg.seq_len:
                raise UsageError(f"{run} holds a run with another configuration; choose another --out or delete it")
            finished = saved.get("step") == cfg.steps
        if not finished:
            train(cfg, resume=(run / "train_state.pt").exists(), progress=not args.no_progress)
        timings[f"train {positional}"] = time.perf_counter() - t
        checkpoints.append(str(run))
    t = time.perf_counter()
    summary = evaluate_checkpoints(checkpoints, out / "evaluation", max_length=args.max_length, data=args.data,
                                   cache_dir=args.cache_dir, batch_size=8, device=args.device or "cpu",
                                   json_path=None, progress=not args.no_progress)
    timings["evaluate"] = time.perf_counter() - t
    t = time.perf_counter()
    info = generate_midi(checkpoints[0], str(out / "generated.mid"), length=args.length, prompt=None,
                         prompt_bars=2, seed=args.seed or 0, top_p=0.9, temperature=1.2,
                         device=args.device or "cpu", progress=not args.no_progress)
    timings["generate"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0
    print()
    _print_summary(summary)
    print(f"\ngenerated {info['out']}: {info['total_tokens']} tokens (training length {info['training_length']}), "
          f"{info['notes']} notes, {info['bars']} bars, {info['beats']:.1f} beats")
    print("wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    print(f"plots: {out / 'evaluation' / 'extrapolation.png'}, {out / positionals[0] / 'loss.png'}")
    (out / "demo.json").write_text(json.dumps({"timings_s": timings, "generated": info,
                                               "evaluation": str(out / "evaluation" / "summary.json")}, indent=2))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from spe.cli.sweep import load_plan, run_sweep

    plan = load_plan(args.plan)
    seeds = None
    if args.seeds:
        try:
            seeds = [int(v) for v in args.seeds.split(",") if v.strip()]
        except ValueError:
            raise UsageError(f"--seeds takes comma-separated integers, got {args.seeds!r}") from None
    only = [v.strip() for v in args.only.split(",") if v.strip()] if args.only else None
    out = Path(args.out)
    run_sweep(plan, out, seeds=seeds, only=only, data=args.data, cache_dir=args.cache_dir, steps=args.steps,
              progress=not args.no_progress)
    print((out / "results.md").read_text())
    return 0


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} takes positive integers, got {text!r}")
    return values


def cmd_bench(args: argparse.Namespace) -> int:
    from spe.bench.run import ATTENTIONS, MODES, SERIES, run_bench, summarize, write_outputs
    from spe.train.config import load_config_file

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        raise UsageError(f"--modes takes {', '.join(MODES)}, got {args.modes!r}")
    attentions = [a.strip() for a in args.attentions.split(",")] if args.attentions else ATTENTIONS
    if set(attentions) - set(ATTENTIONS):
        raise UsageError(f"--attentions takes {', '.join(ATTENTIONS)}, got {args.attentions!r}")
    series = SERIES
    if args.positionals:
        wanted = [p.strip() for p in args.positionals.split(",")]
        known = {f"{p}:{i}" if i not in ("-", "fft") else p for p, i in SERIES}
        if set(wanted) - known:
            raise UsageError(f"--positionals takes {', '.join(sorted(known))}, got {args.positionals!r}")
        series = [(p, i) for p, i in SERIES if (f"{p}:{i}" if i not in ("-", "fft") else p) in wanted]
    result = run_bench(lengths=_int_list(args.lengths, "--lengths"), modes=modes, series=series,
                       attentions=attentions, batch=args.batch_size, num_realizations=args.num_realizations,
                       repeats=args.repeats, budget_s=args.budget_s, device=args.device, threads=args.threads,
                       progress=not args.no_progress,
                       model=load_config_file(args.config or _default_config()).get("model", {}),
                       vocab_size=_remi_vocab_size())
    if args.code_errors:
        from spe.bench.codes import code_errors

        result["code_errors"] = code_errors([4, 8, 16, 32, 64, 128])
    out = Path(args.out)
    json_path = Path(args.json) if args.json else out / "bench.json"
    write_outputs(result, json_path, out)
    print((out / "bench.md").read_text())
    for key, value in summarize(result)["exponents"].items():
        print(f"scaling exponent {key}: {value['exponent']:.2f} (N={value['from']}..{value['to']})")
    log.info("wrote %s, %s and plots in %s", json_path, out / "bench.md", out)
    return 0


def _remi_vocab_size() -> int:
    """Vocabulary of the REMI tokenizer used for music (300 if MidiTok is not installed)."""
    try:
        from spe.data.music import make_tokenizer
    except ImportError:
        return 300
    return len(make_tokenizer())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spe", description="Stochastic positional encoding for linear Transformers, "
                                     "trained on symbolic music (REMI tokens).")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a decoder LM on MIDI (default: Bach chorales)")
    _add_train_flags(p)
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="cross-entropy per position, within and beyond the training length")
    p.add_argument("--checkpoint", action="append", required=True, help="run folder or .safetensors (repeatable)")
    p.add_argument("--data", help="MIDI folder (default: the checkpoint's training data)")
    p.add_argument("--cache-dir")
    p.add_argument("--max-length", type=int, help="positions to evaluate (default: 3 × training length)")
    p.add_argument("--out", default="runs/evaluation", help="folder for CSV, PNG, JSON")
    p.add_argument("--json", help="also write bucket means (start, end, ce, n) to this file")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-realizations", type=int, help="SPE realisations R at test time (default: as trained)")
    p.add_argument("--num-draws", type=int, default=1,
                   help="SPE codes whose predicted probabilities are averaged (default 1)")
    p.add_argument("--window", type=int,
                   help="sliding attention window W in positions (0: the whole past; default: as trained)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("report", help="Markdown report: extrapolation, PE metrics, pictures, generations")
    p.add_argument("--checkpoint", action="append", required=True, help="run folder or .safetensors (repeatable)")
    p.add_argument("--out", required=True, help="folder for report.md, report.json, figures and MIDI")
    p.add_argument("--data", help="MIDI folder (default: the first checkpoint's training data)")
    p.add_argument("--cache-dir")
    p.add_argument("--max-length", type=int, help="evaluated positions (default: 2 × training length)")
    p.add_argument("--r-test", help="comma-separated test-time R for the R ablation of SPE models, e.g. 8,32,64")
    p.add_argument("--length", type=int, default=1024, help="tokens generated after the prompt, per model")
    p.add_argument("--probe-tokens", type=int, default=16, help="vocabulary tokens for identical-token probing")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("generate", help="sample new music (nucleus sampling) to a MIDI file")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--prompt", help="MIDI file whose first bars start the piece")
    p.add_argument("--prompt-bars", type=int, default=2, help="bars of the prompt to keep")
    p.add_argument("--length", type=int, default=1024, help="tokens to generate (may exceed the training length)")
    p.add_argument("--out", default="generated.mid")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--temperature", type=float, default=1.2)
    p.add_argument("--window", type=int,
                   help="sliding attention window W in positions (0: the whole past; default: as trained)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("bench", help="time and peak memory of attention layers per positional encoding")
    p.add_argument("--lengths", default="512,1024,2048,4096,8192,16384", help="comma-separated lengths")
    p.add_argument("--modes", default="train,generate",
                   help="train (one layer forward+backward), generate (one recurrent step), model (one AdamW step "
                        "of the whole model of --config, batch 8)")
    p.add_argument("--config", help="TOML whose [model] section builds the model for --modes model "
                   "(default: the packaged demo config)")
    p.add_argument("--positionals", help="subset of: ape, sinespe:fused, sinespe:reference, convspe, ape-learned, "
                   "rope, shaw, music-relative, alibi")
    p.add_argument("--attentions", help="subset of: softmax, performer, linear")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--num-realizations", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions (median reported)")
    p.add_argument("--code-errors", action="store_true",
                   help="also measure sineSPE estimation error vs R, Gaussian vs orthogonal noise")
    p.add_argument("--budget-s", type=float, default=30.0, help="skip cases predicted to take longer per run")
    p.add_argument("--json", help="records file (default OUT/bench.json)")
    p.add_argument("--out", default="runs/bench", help="folder for JSON, Markdown table and plots")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("sweep", help="train and evaluate the variants × seeds of a plan file (resumable)")
    p.add_argument("--plan", default="ablation", help="plan TOML, or the name of a packaged plan (ablation)")
    p.add_argument("--out", default="runs/sweep", help="sweep folder: runs, results.json, results.md")
    p.add_argument("--seeds", help="comma-separated seeds (default: the plan's)")
    p.add_argument("--only", help="comma-separated variants to run (default: all)")
    p.add_argument("--data", help="training data for every variant (folder or music21:NAME; default Bach)")
    p.add_argument("--cache-dir")
    p.add_argument("--steps", type=int, help="override every variant's optimizer steps")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("demo", help="the main job: train sinespe and ape, evaluate, generate")
    _add_train_flags(p, with_out=False)
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--positionals", default="sinespe,ape", help="comma-separated encodings to train")
    p.add_argument("--max-length", type=int, help="evaluated positions (default 3 × training length)")
    p.add_argument("--length", type=int, default=1024, help="tokens to generate")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_demo)
    return parser


def _check_args(args: argparse.Namespace) -> None:
    device = getattr(args, "device", None)
    if device is not None:
        if not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
            raise UsageError(f"--device must be cpu or cuda, got {device!r}")
        if device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise UsageError("--device cuda was asked for but PyTorch sees no CUDA device")
    for flag in ("batch_size", "max_length", "length", "steps", "seq_len", "repeats", "prompt_bars"):
        value = getattr(args, flag, None)
        if value is not None and value < (0 if flag == "prompt_bars" else 1):
            raise UsageError(f"--{flag.replace('_', '-')} must be positive, got {value}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    try:
        _check_args(args)
        return args.func(args)
    except KeyboardInterrupt:
        print("spe: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as err:
        print(f"spe {args.command}: error: {err}; install the music extra: pip install 'spe[music]'",
              file=sys.stderr)
        return 2
    except (ValueError, OSError) as err:
        print(f"spe {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

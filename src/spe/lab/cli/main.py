"""The ``spe`` command: argument parsing and printing only.

Every command calls the library below it (:mod:`spe.lab.music`, :mod:`spe.lab.music.evaluation`,
:mod:`spe.lab.music.generation`, :mod:`spe.lab.music.plan`, :mod:`spe.lab.bench`), which raises
``ValueError``/``OSError`` on user errors; :func:`main` turns those into one-line messages
and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from spe.lab.cli.names import add_aliased, add_option_flag, add_run_flag, add_seq_len_flag, say_defaults
from spe.lab.options import MAX_THREADS, OPTION_RULES, parse_int_list, set_threads
from spe.lab.cli.model_flags import add_model_flags, check_model_flags_apply, model_flag_options

__all__ = ["UsageError", "build_parser", "main"]

log = logging.getLogger("spe")

_TRAIN_FLAGS = ("data", "cache_dir", "out", "steps", "seq_len", "batch_size", "lr", "seed", "device",
                "eval_every", "threads", "warmup_steps", "precision", "keep_checkpoints", "max_piece_tokens",
                "val_fraction", "tempos", "time_signatures", "merge_tracks", "legacy_tokenizer")


class UsageError(ValueError):
    """A command-line mistake, reported without a traceback."""


def _train_config(args: argparse.Namespace, **overrides):
    """The TrainConfig of --config (default: the packaged demo config) with the flags given on top.

    Defaults that depend on other options (softmax for score encodings, a window of the
    training length for SPE) are the config layer's: :func:`spe.lab.music.config.resolve_model_options`.
    """
    from spe.attention.fourier import MIXERS
    from spe.lab.music.config import TrainConfig, load_config_file, packaged_config

    raw = load_config_file(args.config or packaged_config("demo"))
    if not args.config and isinstance(raw.get("threads"), int):  # the packaged default, on a smaller machine
        raw["threads"] = min(raw["threads"], MAX_THREADS)
    model = raw.pop("model", {})
    if not isinstance(model, dict):
        raise UsageError(f"config file {args.config}: model must be a [model] table, got {model!r}")
    model = dict(model)
    for flag in _TRAIN_FLAGS:
        if getattr(args, flag, None) is not None:
            raw[flag] = getattr(args, flag)
    model.update(model_flag_options(args))
    if not args.config and getattr(args, "positional", None) is None and model.get("attention") in MIXERS:
        model.pop("positional", None)  # the packaged SPE: a Fourier mixer takes its own (resolve_model_options)
    for flag in ("tensorboard", "compile", "allow_data_change", "state_passing"):
        if getattr(args, flag, False):
            raw[flag] = True
    raw.update(overrides)
    raw["model"] = model
    try:
        return TrainConfig.from_dict(raw)
    except TypeError as err:  # typed flags are argparse's: a wrong type comes from the file or --model-option
        raise UsageError(f"config file {args.config}: {err}" if args.config else str(err)) from None
    except ValueError as err:
        if not args.config:
            raise
        where = "" if str(err).startswith("unknown") else " (options of that file and the command line)"
        raise UsageError(f"config file {args.config}: {err}{where}") from None


def _add_piece_bound_flag(p: argparse.ArgumentParser, default: str = "65536") -> None:
    p.add_argument("--max-piece-tokens", type=int,
                   help=f"longest piece kept, in REMI tokens: longer ones are cropped to their first N tokens "
                   f"and counted (default {default}, 3.8 times the longest Bach chorale)")


def _add_tokenizer_flags(p: argparse.ArgumentParser) -> None:
    """--tempos, --time-signatures, --merge-tracks (and their --no- forms): what the REMI tokenizer
    keeps (TrainConfig's fields of the same names; a resumed or evaluated run keeps its own)."""
    for name, what in (("tempos", "keep tempo tokens (else every piece decodes at 120 qpm)"),
                       ("time_signatures", "keep time-signature tokens (else every bar is 4/4)"),
                       ("merge_tracks", "merge tracks that share a program into one (else a Track token "
                                        "after the Program token keeps them apart)"),
                       ("legacy_tokenizer", "the tokenizer of the runs from before these three options "
                                            "(MidiTok's REMI defaults; the three are then not read)")):
        p.add_argument("--" + name.replace("_", "-"), dest=name, action=argparse.BooleanOptionalAction,
                       default=None, help=what)


def _add_train_flags(p: argparse.ArgumentParser, *, with_out: bool = True) -> None:
    p.add_argument("--config", help="TOML file of options (default: the packaged demo config)")
    p.add_argument("--data", help="folder of .mid/.midi files, or music21:NAME for a composer of music21's "
                   "corpus (e.g. music21:palestrina); default: the Bach chorales")
    p.add_argument("--cache-dir", help="cache for converted MIDI and tokens (default ~/.cache/spe)")
    _add_piece_bound_flag(p)
    _add_tokenizer_flags(p)
    if with_out:
        add_run_flag(p, "out", note="the run folder: checkpoints, logs and plots")
    add_option_flag(p, "steps")
    add_seq_len_flag(p, note="random crops of the pieces")
    p.add_argument("--val-fraction", type=float, metavar="F",
                   help=f"share of the pieces held out for validation, {OPTION_RULES['val_fraction'].allowed()}: "
                   "round(F × pieces), one at least, and a warning below three")
    add_option_flag(p, "batch_size", note="here crops of --seq-len tokens")
    for name in ("lr", "warmup_steps", "eval_every"):
        add_option_flag(p, name)
    add_model_flags(p)
    from spe.lab.music.config import packaged_defaults

    add_run_flag(p, "seed")
    for name in ("device", "threads", "precision"):
        add_run_flag(p, name)
    for name in ("tensorboard", "keep_checkpoints", "compile"):
        add_option_flag(p, name)
    say_defaults(p, packaged_defaults(), "from the packaged demo config; --config's if it sets it")


def _resume_config(args: argparse.Namespace):
    """--resume: the run's recorded configuration (:func:`spe.lab.music.config.resume_config`), with
    what the flags and --config set checked against it; the flags' configuration where the run
    records none."""
    from spe.lab.music.config import load_config_file, packaged_config, resume_config

    given, sources = {"model": {}}, {}
    if args.config:
        raw = load_config_file(args.config)
        model = raw.get("model", {})
        if not isinstance(model, dict):
            raise UsageError(f"config file {args.config}: model must be a [model] table, got {model!r}")
        given = {**{k: v for k, v in raw.items() if k != "model"}, "model": dict(model)}
        sources = {k: f"config file {args.config}" for k in {*raw, *given["model"]} - {"model"}}
    switches = [f for f in ("tensorboard", "compile", "allow_data_change", "state_passing") if getattr(args, f, False)]
    for flag in (*_TRAIN_FLAGS, *switches):
        if getattr(args, flag, None) is not None:
            given[flag], sources[flag] = getattr(args, flag), f"--{flag.replace('_', '-')}"
    for key, value in model_flag_options(args).items():
        given["model"][key], sources[key] = value, f"--{key.replace('_', '-')}"
    out = given.get("out") or load_config_file(packaged_config("demo")).get("out") or "runs/default"
    try:
        cfg = resume_config(out, given, sources=sources)
    except ValueError as err:
        if args.config and str(err).startswith("unknown"):
            raise UsageError(f"config file {args.config}: {err}") from None
        raise
    return cfg or _train_config(args)


def cmd_train(args: argparse.Namespace) -> int:
    from spe.lab.music.train import train

    cfg = _resume_config(args) if args.resume and not args.overwrite else _train_config(args)
    check_model_flags_apply(args, cfg.model)  # before any data is read: an option the model would ignore
    out = train(cfg, resume=args.resume, progress=not args.no_progress, overwrite=args.overwrite)
    log.info("checkpoint: %s", out / "model.safetensors")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from spe.lab.music.evaluation.checkpoints import evaluate_checkpoints, summary_table

    set_threads(args.threads, "--threads")
    summary = evaluate_checkpoints(args.checkpoint, Path(args.out), max_length=args.max_length, data=args.data,
                                   cache_dir=args.cache_dir, batch_size=args.batch_size, device=args.device,
                                   json_path=args.json, progress=not args.no_progress,
                                   num_realizations=args.num_realizations, num_draws=args.num_draws,
                                   window=args.window, split=args.split, max_piece_tokens=args.max_piece_tokens)
    print(summary_table(summary))
    log.info("wrote %s", ", ".join(str(Path(args.out) / f) for f in ("per_position.csv", "extrapolation.png", "summary.json")))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from spe.lab.music.generation import generate_midi

    set_threads(args.threads, "--threads")
    info = generate_midi(args.checkpoint, args.out, length=args.length, prompt=args.prompt,
                         prompt_bars=args.prompt_bars, seed=args.seed, top_p=args.top_p,
                         temperature=args.temperature, device=args.device, progress=not args.no_progress,
                         window=args.window)
    print(f"wrote {info['out']}: {info['total_tokens']} tokens ({info['prompt_tokens']} from the prompt), "
          f"{info['notes']} notes, {info['bars']} bars, {info['beats']:.1f} beats")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from spe.lab.music.evaluation.report import build_report

    if args.probe_tokens < 1:
        raise UsageError(f"--probe-tokens must be positive, got {args.probe_tokens}")
    set_threads(args.threads, "--threads")
    path = build_report(args.checkpoint, Path(args.out), data=args.data, cache_dir=args.cache_dir,
                        max_length=args.max_length, r_test=parse_int_list(args.r_test, "--r-test") if args.r_test else (),
                        generate_length=args.length, num_probe_tokens=args.probe_tokens, device=args.device,
                        progress=not args.no_progress)
    print(f"wrote {path}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """train each positional encoding -> evaluate them together -> generate with the first."""
    from spe.lab.music.evaluation.checkpoints import summary_table
    from spe.lab.music.demo import run_demo

    out = Path(args.out)
    positionals = [p.strip() for p in args.positionals.split(",") if p.strip()]
    if not positionals:
        raise UsageError("--positionals must name at least one encoding")
    configs = []
    for positional in positionals:
        args.positional = positional
        configs.append(_train_config(args, out=str(out / positional)))
    check_model_flags_apply(args, [cfg.model for cfg in configs])  # an option none of them reads
    result = run_demo(configs, out, max_length=args.max_length, length=args.length, seed=args.seed or 0,
                      data=args.data, cache_dir=args.cache_dir, device=args.device or "cpu",
                      progress=not args.no_progress)
    info = result["generated"]
    print()
    print(summary_table(result["summary"]))
    print(f"\ngenerated {info['out']}: {info['total_tokens']} tokens (training length {info['training_length']}), "
          f"{info['notes']} notes, {info['bars']} bars, {info['beats']:.1f} beats")
    print("wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in result["timings_s"].items()))
    print(f"plots: {out / 'evaluation' / 'extrapolation.png'}, {out / positionals[0] / 'loss.png'}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from spe.lab.cli.plans import cmd_plan

    return cmd_plan(args, "music")


def cmd_bench(args: argparse.Namespace) -> int:
    from spe.lab.bench.forms import parse_fox_path_impls
    from spe.lab.bench.peers import PEER_ATTENTIONS
    from spe.lab.bench.run import (BENCH_ATTENTIONS, KERNEL_NAMES, MODES, bench_outputs, parse_blocks, parse_decays,
                               parse_pairs, parse_series, parse_softmax_impls, run_bench, summarize_bench,
                               write_outputs)
    from spe.lab.music.config import load_config_file, packaged_config
    from spe.lab.engine.precision import check_precision

    if args.modes is None:  # --longest alone runs only the search
        args.modes = "" if args.longest else "train,generate"
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if (not modes and not args.longest) or set(modes) - set(MODES):
        raise UsageError(f"--modes takes {', '.join(MODES)}, got {args.modes!r}")
    attentions = [a.strip() for a in args.attentions.split(",")] if args.attentions else None
    if attentions and set(attentions) - {*KERNEL_NAMES, *PEER_ATTENTIONS}:
        raise UsageError(f"--attentions takes {', '.join([*KERNEL_NAMES, *PEER_ATTENTIONS])}, "
                         f"got {args.attentions!r}")
    try:
        series = parse_series(args.positionals)
        pairs = parse_pairs(args.pairs) if args.pairs else None
        model_series = parse_series(args.model_positionals) if args.model_positionals else series
    except ValueError as e:
        raise UsageError(str(e)) from None
    model = load_config_file(args.config or packaged_config("demo")).get("model", {})
    try:
        decays = parse_decays(args.decay, model.get("decay", "none"))
        check_precision(args.precision, args.device.split(":")[0])
        softmax_impls = parse_softmax_impls(args.softmax_impl)
        fox_path_impls = parse_fox_path_impls(args.fox_path_impl)
        blocks = parse_blocks(args.attention_blocks)
    except ValueError as e:
        raise UsageError(str(e)) from None
    out, json_path = bench_outputs(args.out, args.json)  # checked before measuring, not at the final write
    layer_modes = [m for m in modes if m != "model"]
    result = {"records": [], "matmul_gflops": None, "config": {}, "lengths": []}
    if layer_modes:
        result = run_bench(lengths=parse_int_list(args.lengths, "--lengths"), modes=layer_modes, series=series,
                           attentions=attentions or BENCH_ATTENTIONS, batch=args.batch_size,
                           num_realizations=args.num_realizations, repeats=args.repeats, budget_s=args.budget_s,
                           device=args.device, threads=args.threads, progress=not args.no_progress, pairs=pairs,
                           decay=decays, precision=args.precision, softmax_impls=softmax_impls,
                           fox_path_impls=fox_path_impls, attention_blocks=blocks)
    if "model" in modes or args.longest:
        result.update(_bench_model(args, model, model_series, attentions, decays))
    if result["matmul_gflops"] is None:
        from spe.lab.bench.run import matmul_gflops

        result["matmul_gflops"] = matmul_gflops()
    if args.code_errors:
        from spe.lab.bench.codes import code_errors

        result["code_errors"] = code_errors([4, 8, 16, 32, 64, 128])
    result["command"] = "spe " + " ".join(getattr(args, "argv", ["bench"]))
    result["precision"] = args.precision
    write_outputs(result, json_path, out)
    print((out / "bench.md").read_text())
    for key, value in summarize_bench(result)["exponents"].items():
        print(f"scaling exponent {key}: {value['exponent']:.2f} (N={value['from']}..{value['to']})")
    log.info("wrote %s, %s and plots in %s", json_path, out / "bench.md", out)
    return 0


def _bench_model(args: argparse.Namespace, model: dict, series, attentions, decays: list[str]) -> dict:
    """``--modes model`` (interleaved rounds of one AdamW step per encoding) and ``--longest``."""
    from spe.lab.bench.model import longest_length, merge_rounds, parse_longest, parse_shapes, run_model_rounds
    from spe.lab.bench.model import remi_vocab_size
    from spe.models import ModelConfig

    default_attention = model.get("attention", ModelConfig.attention)
    common = dict(model=model, vocab_size=remi_vocab_size(), repeats=args.repeats, device=args.device,
                  threads=args.threads, max_seconds=args.budget_s, precision=args.precision)
    timeout = max(120.0, 8 * args.budget_s)
    out: dict = {"memory_budget_mb": args.memory_budget_mb}
    if args.rounds < 1:
        raise UsageError(f"--rounds must be at least 1, got {args.rounds}")
    try:
        shapes = parse_shapes(args.model_shapes)
        longest = parse_longest(args.longest, default_attention) if args.longest else []
    except ValueError as e:
        raise UsageError(str(e)) from None
    if "model" in [m.strip() for m in args.modes.split(",")]:
        from spe.lab.bench.peers import PEER_ATTENTIONS

        model_attentions = [a for a in attentions or [default_attention] if a not in PEER_ATTENTIONS]
        triples = [(p, i, a) for a in model_attentions or [default_attention] for p, i in series]
        raw = run_model_rounds(common, triples, shapes, args.rounds, timeout, progress=not args.no_progress,
                               compiled=(False, True) if args.compile else (False,), decays=decays)
        out.update(model_rounds=raw, model=merge_rounds(raw))
    out["longest"] = [longest_length(common, p, i, a, budget_mb=args.memory_budget_mb,
                                     measure_limit_mb=args.measure_limit_mb, start=args.longest_start,
                                     max_step_s=args.budget_s, timeout=timeout, progress=not args.no_progress)
                     for p, i, a in longest]
    return out


def _add_train_parser(sub) -> None:
    p = sub.add_parser("train", help="train a decoder LM on MIDI (default: Bach chorales)")
    _add_train_flags(p)
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run in --out (its checkpoints, metrics and plots) instead of refusing")
    add_option_flag(p, "allow_data_change")
    p.add_argument("--state-passing", action="store_true", help="start each crop from the detached final state "
                   "of a previous step's crop (Buitrago Ruiz & Gu 2025); recurrent-state kernels only")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train)


def _add_evaluate_parser(sub) -> None:
    p = sub.add_parser("evaluate", help="cross-entropy per position, within and beyond the training length")
    p.add_argument("--checkpoint", action="append", required=True, help="run folder or .safetensors (repeatable)")
    p.add_argument("--data", help="MIDI folder (default: the checkpoint's training data)")
    p.add_argument("--split", choices=("validation", "train", "all", "test"),
                   help="pieces of the data to evaluate (default: validation for the checkpoint's own "
                   "training data, all for any other --data; test: those its test_min_tokens held out)")
    p.add_argument("--cache-dir", help="cache for converted MIDI and tokens (default ~/.cache/spe)")
    _add_piece_bound_flag(p, "the checkpoint's run's, else 65536")
    add_aliased(p, "--eval-length", "--max-length", type=int, dest="max_length",
                help="positions evaluated (default: 3 × training length; test: test_min_tokens − 1)")
    add_run_flag(p, "out", note="the folder for CSV, PNG and JSON", default="runs/evaluation")
    p.add_argument("--json", help="also write bucket means (start, end, ce, n) to this file")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward pass (default 8)")
    p.add_argument("--num-realizations", type=int, help="SPE realisations R at test time (default: as trained)")
    p.add_argument("--num-draws", type=int, default=1,
                   help="SPE codes whose predicted probabilities are averaged (default 1)")
    add_aliased(p, "--attention-window", "--window", type=int, dest="window", metavar="W",
                help="sliding attention window W (0: the whole past; default: as trained)")
    add_run_flag(p, "device", default="cpu")
    add_run_flag(p, "threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_evaluate)


def _add_report_parser(sub) -> None:
    p = sub.add_parser("report", help="Markdown report: extrapolation, PE metrics, pictures, generations")
    p.add_argument("--checkpoint", action="append", required=True, help="run folder or .safetensors (repeatable)")
    add_run_flag(p, "out", note="the folder for report.md, report.json, figures and MIDI", required=True)
    p.add_argument("--data", help="MIDI folder (default: the first checkpoint's training data)")
    p.add_argument("--cache-dir")
    add_aliased(p, "--eval-length", "--max-length", type=int, dest="max_length",
                help="positions evaluated (default: 2 × training length)")
    p.add_argument("--r-test", help="comma-separated test-time R for the R ablation of SPE models, e.g. 8,32,64")
    p.add_argument("--length", type=int, default=1024, help="tokens generated after the prompt, per model")
    p.add_argument("--probe-tokens", type=int, default=16, help="vocabulary tokens for identical-token probing")
    add_run_flag(p, "device", default="cpu")
    add_run_flag(p, "threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_report)


def _add_generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="sample new music (nucleus sampling) to a MIDI file")
    p.add_argument("--checkpoint", required=True, help="run folder or .safetensors of a trained model")
    p.add_argument("--prompt", help="MIDI file whose first bars start the piece (default: none)")
    p.add_argument("--prompt-bars", type=int, default=2, help="prompt bars kept, ≥ 1 (default 2; past its end: all)")
    p.add_argument("--length", type=int, default=1024, help="tokens to generate (default 1024; may exceed training)")
    add_run_flag(p, "out", note="the MIDI file", default="generated.mid")
    add_run_flag(p, "seed", note="the sampling's", default=0)
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus: top tokens of mass P, in (0, 1] (default 0.9)")
    p.add_argument("--temperature", type=float, default=1.2, help="divides the logits, > 0 (default 1.2)")
    add_aliased(p, "--attention-window", "--window", type=int, dest="window", metavar="W",
                help="sliding attention window W (0: the whole past; default: as trained)")
    add_run_flag(p, "device", default="cpu")
    add_run_flag(p, "threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_generate)


def _add_bench_parser(sub) -> None:
    from spe.lab.cli.names import flag_choices

    names = flag_choices()
    p = sub.add_parser("bench", help="time and peak memory of attention layers per positional encoding")
    p.add_argument("--lengths", default="512,1024,2048,4096,8192,16384", help="comma-separated lengths")
    p.add_argument("--modes",
                   help="train (one layer forward+backward), generate (one recurrent step), prefill (a prompt of N "
                        "at once), model (one AdamW step of the whole model of --config at each --model-shapes, in "
                        "--rounds interleaved rounds); default train,generate, or only the search with --longest")
    p.add_argument("--config", help="TOML whose [model] section builds the model for --modes model and --longest "
                   "(default: the packaged demo config)")
    from spe.lab.bench.run import SERIES, series_name

    p.add_argument("--positionals", help="comma-separated subset of: " + ", ".join(series_name(*s) for s in SERIES)
                   + " (sinespe: the automatic choice; convspe: fft; default: all)")
    p.add_argument("--pairs", help="train/generate modes: exactly these POSITIONAL+ATTENTION cases, e.g. "
                   "ape+softmax,ape+performer,sinespe:blocked+performer (instead of every --positionals × "
                   "--attentions pair)")
    p.add_argument("--model-positionals", help="--modes model: the encodings to step (default: --positionals)")
    p.add_argument("--model-shapes", default="8x2048,2x8192",
                   help="BATCHxLENGTH pairs for --modes model (default 8x2048,2x8192)")
    p.add_argument("--rounds", type=int, default=2,
                   help="--modes model: rounds, each cycling through the encodings (default 2)")
    p.add_argument("--longest", help="search the longest length at batch 1 within --memory-budget-mb for these "
                   "encodings, e.g. ape,sinespe,convspe,ape+softmax (+ATTENTION overrides the config's)")
    p.add_argument("--memory-budget-mb", type=float, default=16384.0, help="--longest: budget (default 16384)")
    p.add_argument("--measure-limit-mb", type=float, default=12000.0,
                   help="--longest: measure no point predicted above this; extrapolate beyond (default 12000)")
    p.add_argument("--longest-start", type=int, default=4096, help="--longest: first length (default 4096)")
    p.add_argument("--attentions", help="attention kernels (default: softmax, performer, linear-elu), the Fourier "
                   "mixers fnet (train mode) and fnet-causal (with ape/none), and performer-pytorch (lucidrains' "
                   "layer, train mode with ape/none, if installed)")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--num-realizations", type=int, default=64)
    p.add_argument("--decay", metavar="DECAYS", help=f"decay modes ({', '.join(names['decay'])}), each measured "
                   "for every case whose kernel takes it in one run, e.g. none,fixed: RoPE and RoPE + decay side by "
                   "side as ratios to APE without decay (default: the --config's, none)")
    p.add_argument("--softmax-impl", default="auto", metavar="IMPLS",
                   help="softmax's paths (auto, flex, blocks), each measured for every softmax case of the layer "
                        "modes, e.g. blocks,flex: FlexAttention beside the per-block form (FoX with --decay gated, "
                        "the score encodings with a flex form, windows; flex's backward needs CUDA) (default auto)")
    from spe.ops.path.flash import FLASH_MIN_LENGTH
    from spe.ops.softmax.chunk import FLASH_FOX_MIN_LENGTH

    p.add_argument("--fox-path-impl", metavar="FORMS",
                   help="FoX's and PaTH's kernel forms (auto, chunk, flash), each measured for every train and "
                        "prefill case of FoX (softmax with --decay gated), PaTH and PaTH-FoX (path+softmax), e.g. "
                        "chunk,flash: the O(L)-memory form beside the one that keeps the L x L terms, at any length "
                        f"(auto: flash from {FLASH_FOX_MIN_LENGTH:,} positions for FoX, {FLASH_MIN_LENGTH:,} for "
                        "PaTH); rows name the form that ran, with ratios to plain softmax and flash / chunk "
                        "(default: the kernels choose, rows name no form)")
    p.add_argument("--attention-blocks", metavar="BLOCKS",
                   help="block lengths N of block-local attention (the Music Transformer's), each measured for "
                        "every softmax case of the layer modes that takes it, e.g. 0,64: full attention beside "
                        "blocks of 64 (0: full attention; default 0)")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions (median reported)")
    p.add_argument("--compile", action="store_true",
                   help="--modes model: also measure every encoding with torch.compile, sineSPE's learned-time "
                        "product's elementwise passes too (rows marked compiled)")
    p.add_argument("--code-errors", action="store_true",
                   help="also measure sineSPE estimation error vs R, Gaussian vs orthogonal noise")
    p.add_argument("--budget-s", type=float, default=30.0, help="skip cases predicted to take longer per run")
    p.add_argument("--json", help="records file (default OUT/bench.json)")
    add_run_flag(p, "out", note="the folder for JSON, Markdown table and plots", default="runs/bench")
    add_run_flag(p, "device", default="cpu")
    add_run_flag(p, "precision", note="of the timed work, as spe train's (weights float32; fp16 with a gradient "
                 "scaler in model mode)", default="fp32")
    add_run_flag(p, "threads", default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_bench)


def _add_sweep_parser(sub) -> None:
    from spe.lab.cli.plans import add_plan_flags

    p = sub.add_parser("sweep", help="train and evaluate the variants × seeds of a plan file (resumable)")
    add_plan_flags(p, "music", default="ablation")
    add_run_flag(p, "out", note="the sweep folder: runs, results.json, results.md", default="runs/sweep")
    p.add_argument("--data", help="training data for every variant (folder or music21:NAME; default Bach)")
    p.add_argument("--cache-dir")
    p.add_argument("--steps", type=int, help="override every variant's optimizer steps")
    add_run_flag(p, "threads", note="every variant's (1 to run sweeps side by side)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_sweep)


def _add_demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="the main job: train sinespe and ape, evaluate, generate")
    _add_train_flags(p, with_out=False)
    add_run_flag(p, "out", note="a run folder per encoding, evaluation/ and the generated MIDI", default="runs/demo")
    p.add_argument("--positionals", default="sinespe,ape", help="comma-separated encodings to train")
    add_aliased(p, "--eval-length", "--max-length", type=int, dest="max_length",
                help="positions evaluated (default: 3 × training length)")
    p.add_argument("--length", type=int, default=1024, help="tokens to generate")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spe", description="Stochastic positional encoding for linear Transformers, "
                                     "trained on symbolic music (REMI tokens).")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_train_parser, _add_evaluate_parser, _add_report_parser, _add_generate_parser,
                _add_bench_parser, _add_sweep_parser, _add_demo_parser):
        add(sub)
    from spe.lab.cli.lra import add_lra_parser  # LRA: its own module (parsing only)

    add_lra_parser(sub)
    from spe.lab.cli.synth import add_synth_parser  # synthetic tasks: their own module (parsing only)

    add_synth_parser(sub)
    from spe.lab.cli.export import add_export_parser  # transformers export: its own module (parsing only)

    add_export_parser(sub)
    from spe.lab.cli.app import add_app_parser  # the listening page: its own module (parsing only)

    add_app_parser(sub)
    return parser


def _check_args(args: argparse.Namespace, flags: dict[str, str]) -> None:
    """Every flag given, checked before any work: a flag of an option by the option's one rule
    (:func:`spe.lab.options.check_flags`; ``flags``: destination -> the flag's name), the others here.

    Raises:
        ValueError: naming the flag (its canonical name, whichever alias was typed) and the value.
    """
    from spe.lab.options import check_flags

    check_flags({k: v for k, v in vars(args).items() if k != "command"}, flags)
    if (getattr(args, "device", None) or "").startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda was asked for but PyTorch sees no CUDA device")
    for flag in ("length", "repeats", "prompt_bars"):  # no option of a config: rules of these commands
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be positive, got {value}")
    _check_library_options(args)


def _check_library_options(args: argparse.Namespace) -> None:
    """Flags whose rule the library owns, checked by the library's own validator before any work."""
    from spe.models.config import decode_window

    decode_window(getattr(args, "window", None), "--attention-window")
    if getattr(args, "temperature", None) is not None:
        from spe.generation import check_sampling

        check_sampling(top_p=args.top_p, temperature=args.temperature, top_p_name="--top-p",
                       temperature_name="--temperature")


def _canonical_flags(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """Destination -> the flag that names it in messages, for ``command``'s parser: its first
    name, never an alias (an alias sets no default of its own: :func:`~spe.lab.cli.names.add_aliased`)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {a.dest: a.option_strings[0] for a in sub._actions
            if a.option_strings and a.default is not argparse.SUPPRESS}


def _one_line(err: BaseException) -> str:
    """The error's message on one line (library messages are; wrapped third-party ones may not be)."""
    return " ".join(str(err).split())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    # Under torchrun only rank 0 reports progress; the others report warnings and errors.
    quiet = args.quiet or os.environ.get("RANK", "0") != "0"
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(message)s")
    try:
        _check_args(args, _canonical_flags(parser, args.command))
        return args.func(args)
    except KeyboardInterrupt:
        print("spe: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as err:
        print(f"spe {args.command}: error: {err}; install the music extra: pip install 'spe[music]'",
              file=sys.stderr)
        return 2
    except (ValueError, OSError) as err:
        print(f"spe {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``spe synth``: parsing and printing only; the work is :func:`spe.lab.synth.run_synth` (one experiment),
:func:`spe.lab.plans.run` (``--plan``, :mod:`spe.lab.cli.plans`) and :func:`spe.lab.synth.write_data` (``--write-data``).

The model flags are ``spe train``'s, declared once (:func:`spe.lab.cli.main.add_model_flags`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_synth_parser", "cmd_synth"]

# Flags that define an experiment (a plan sets them per row) beside the model flags; run flags go to
# every row (spe.lab.synth.study.SynthPlans.run_options, the experiment's too).
_EXPERIMENT_FLAGS = ("task", "seq_len", "eval_lengths", "batch_size", "lr", "eval_every")


def _config(args: argparse.Namespace):
    from spe.lab.cli.model_flags import check_model_flags_apply, model_flag_options
    from spe.lab.options import parse_int_list
    from spe.lab.synth import SynthPlans, preset_config

    options = {"seq_len": args.seq_len, "batch_size": args.batch_size, "lr": args.lr,
               "eval_every": args.eval_every, **{f: getattr(args, f) for f in SynthPlans.run_options}}
    if args.eval_lengths is not None:
        options["eval_lengths"] = parse_int_list(args.eval_lengths, "--eval-lengths")
    cfg = preset_config(args.task, model=model_flag_options(args), **options)
    check_model_flags_apply(args, cfg.model)  # an option the model would ignore, before any data is made
    return cfg


def _given_model_flags(args: argparse.Namespace) -> list[str]:
    from spe.lab.cli.model_flags import model_flag_options

    given = [f"--{f.replace('_', '-')}" for f in _EXPERIMENT_FLAGS if getattr(args, f, None) is not None]
    return given + [f"--{k.replace('_', '-')}" for k in model_flag_options(args)]


def cmd_synth(args: argparse.Namespace) -> int:
    from spe.lab.options import parse_seeds

    seeds = parse_seeds(args.seeds) if args.seeds else None
    if args.plan or args.only or args.collect:
        from spe.lab.cli.plans import cmd_plan

        return cmd_plan(args, "synth", _given_model_flags(args) + (["--write-data"] if args.write_data is not None
                                                                   else []))
    if args.task is None:
        raise ValueError("give --task (flip-flop or mqar) or a --plan")
    if args.write_data is not None:  # '' too (an unset shell variable): refused, not taken as absent
        from spe.lab.synth.run import check_data_folder

        check_data_folder(args.write_data)
    cfg = _config(args)
    if args.write_data is not None:
        from spe.lab.synth import write_data

        files = write_data(cfg, args.write_data, seed=(seeds or [0])[0])
        print(f"wrote {len(files)} files to {args.write_data}: " + ", ".join(f.name for f in files))
        return 0
    from spe.lab.synth import run_synth

    out = Path(args.out or f"runs/synth/{cfg.task}")
    run_synth(cfg, seeds or [0], out, threads=args.threads, progress=not args.no_progress)
    print((out / "results.md").read_text(), end="")
    print(f"results: {out / 'results.json'}")
    return 0


def add_synth_parser(sub) -> None:
    from spe.lab.cli.model_flags import add_model_flags
    from spe.lab.cli.names import add_option_flag, add_run_flag, add_seq_len_flag, say_defaults
    from spe.lab.synth.config import MAX_EVAL_FACTOR, preset_defaults

    p = sub.add_parser("synth", help="synthetic tasks (flip-flop, MQAR): train at one length, test at longer ones")
    p.add_argument("--task", help="flip-flop or mqar (required unless --plan is given)")
    add_seq_len_flag(p, old="--train-length", note="per training sequence")
    p.add_argument("--eval-lengths", help=f"comma-separated test lengths in tokens, up to {MAX_EVAL_FACTOR} L")
    p.add_argument("--write-data", metavar="DIR", help="write the generated splits as JSON lines and vocab.json "
                   "to DIR (refuses existing files) and train nothing")
    add_option_flag(p, "steps", note="per seed")
    add_option_flag(p, "batch_size", note="here sequences of --seq-len tokens")
    for name in ("lr", "eval_every"):
        add_option_flag(p, name)
    add_model_flags(p)
    add_run_flag(p, "out", note="the experiment folder (default runs/synth/TASK; with --plan runs/synth/PLAN)")
    from spe.lab.cli.plans import add_plan_flags

    add_plan_flags(p, "synth", experiment=True, seeds_note="; --write-data: the first seeds the training stream written")
    for name in ("device", "threads", "precision"):
        add_run_flag(p, name)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    say_defaults(p, preset_defaults(), "the preset's")
    p.set_defaults(func=cmd_synth)

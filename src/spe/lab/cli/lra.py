"""``spe lra``: parsing and printing only; the work is :func:`spe.lab.lra.run_lra` (one experiment) and
:func:`spe.lab.plans.run` (``--plan``: the rows of a study plan, :mod:`spe.lab.cli.plans`).

Runs under ``torchrun`` as ``spe train`` does (e.g. ``torchrun --nproc-per-node 2 -m spe lra ...``):
each seed's batch is shared between the processes and only rank 0 writes files.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from spe.lab.cli.names import add_option_flag, add_run_flag, add_seq_len_flag, say_defaults

__all__ = ["add_lra_parser", "cmd_lra"]

# Flags that define an experiment: a study plan sets them per row. Run flags go to every row
# (spe.lab.lra.study.LRAPlans.run_options, the experiment's too).
_EXPERIMENT_FLAGS = ("task", "positional", "attention", "decay", "attention_blocks", "preset", "listops_pipeline",
                     "batch_size", "eval_every", "seq_len", "num_realizations", "model_option", "positional_lr_scale")


def cmd_lra(args: argparse.Namespace) -> int:
    if args.plan or args.collect or args.only:
        from spe.lab.cli.plans import cmd_plan

        return cmd_plan(args, "lra", [f"--{f.replace('_', '-')}" for f in _EXPERIMENT_FLAGS
                                      if getattr(args, f) not in (None, False, [])])
    if args.task is None:
        raise ValueError("give --task (listops, text, retrieval, image) or a study --plan")
    out, line = _cmd_experiment(args)
    if os.environ.get("RANK", "0") == "0":  # under torchrun rank 0 reports
        print((out / "results.md").read_text(), end="")
        print(line)
    return 0


def _cmd_experiment(args: argparse.Namespace) -> tuple[Path, str]:
    from spe.lab.lra import LRAPlans, default_folder, model_options, parse_seeds, preset_config, run_lra
    from spe.lab.stats import format_mean_std  # one seed: std None, written "–"
    from spe.models.config import check_options_apply

    from spe.attention.fourier import MIXERS

    from spe.lab.cli.model_flags import blocks_flag_option

    flags = {**({"decay": args.decay} if args.decay else {}), **blocks_flag_option(args)}
    model = model_options(args.model_option or [], flags=flags or None)
    mixer = MIXERS.get(args.attention)  # FNet: its own positional default (APE), not SPE's
    positional = args.positional or (mixer.default_positional if mixer else "sinespe")
    cfg = preset_config(args.task, positional, args.attention or "performer",
                        preset=args.preset or "cpu-small", listops_pipeline=args.listops_pipeline, model=model or None,
                        positional_lr_scale=args.positional_lr_scale, num_realizations=args.num_realizations,
                        seq_len=args.seq_len, batch_size=args.batch_size, eval_every=args.eval_every,
                        **{f: getattr(args, f) for f in LRAPlans.run_options if getattr(args, f) is not False})
    given = {k: f"--{k.replace('_', '-')} {v}" if k in flags else f"--model-option {k}={v!r}"
             for k, v in model.items()}
    if args.num_realizations is not None:  # the preset's own options are not checked, only the user's
        given["num_realizations"] = f"--num-realizations {args.num_realizations}"
    check_options_apply({"positional": cfg.positional, "attention": cfg.attention}, given)
    out = Path(args.out) if args.out else default_folder(cfg, model)
    summary = run_lra(cfg, parse_seeds(args.seeds or "0"), out, threads=args.threads, progress=not args.no_progress)
    return out, f"results: {out / 'results.json'} (mean {format_mean_std(summary['mean'], summary['std'])} %)"


def add_lra_parser(sub) -> None:
    from spe.lab.cli.model_flags import add_blocks_flag
    from spe.lab.cli.names import flag_choices
    from spe.lab.lra.config import preset_defaults

    p = sub.add_parser("lra", help="Long Range Arena: train encoder classifiers over seeds, test the best checkpoints")
    names = flag_choices()
    p.add_argument("--task", choices=names["tasks"], help="the task (required unless --plan is given)")
    p.add_argument("--data", help="the task's folder in its official layout (default: the embedded data)")
    p.add_argument("--positional", help=names["positional"] + " (default sinespe, ape with fnet; convspe-2d: "
                   "image only)")
    p.add_argument("--attention", help=", ".join(names["attention"]) + " (default performer)")
    p.add_argument("--decay", choices=names["decay"],
                   help="fixed (RetNet's γ_h = 1 − 2^(−5−h)), learned from there, gated (per head, from the "
                   "input) or gated-channel (GLA's), linear kernels (default: the preset's, none)")
    add_blocks_flag(p)
    p.add_argument("--preset", help="paper or cpu-small (default)")
    p.add_argument("--listops-pipeline", choices=names["pipelines"],
                   help="ListOps tokens: lossless (every symbol, default) or lra-2021 (LRA's original words: "
                        "operators without '[', digits, no ']' and no parentheses)")
    add_option_flag(p, "steps", note="per seed")
    add_option_flag(p, "batch_size", note="pairs for Retrieval")
    add_option_flag(p, "eval_every")
    add_seq_len_flag(p, old="--max-length", note="per sequence (per document for Retrieval), longer ones truncated")
    p.add_argument("--num-realizations", type=int, help="R for SPE")
    p.add_argument("--model-option", action="append", metavar="KEY=VALUE", help="any classifier option, e.g. "
                   "gated=false, gate_init=-2, code_noise=orthogonal (VALUE read as TOML, else text; repeatable)")
    add_option_flag(p, "positional_lr_scale")
    add_run_flag(p, "out", note="the experiment folder (default runs/lra/PRESET/TASK-ATTENTION-POSITIONAL, + "
                 "-lra-2021, + -KEY-VALUE per option, sorted; with --plan runs/lra/PRESET/PLAN)")
    from spe.lab.cli.plans import add_plan_flags

    add_plan_flags(p, "lra", experiment=True)
    add_run_flag(p, "device", default="cpu")
    add_run_flag(p, "threads")
    add_run_flag(p, "precision")
    # per seed: its own folder OUT/seedK
    add_option_flag(p, "tensorboard", note="here OUT/seedK/tensorboard, per seed")
    add_option_flag(p, "keep_checkpoints", note="per seed, in OUT/seedK/checkpoints (default 2)")
    add_option_flag(p, "compile")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    say_defaults(p, preset_defaults(), "the preset's, here cpu-small's per task")
    p.set_defaults(func=cmd_lra)

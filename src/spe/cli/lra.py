"""``spe lra``: parsing and printing only; the work is :func:`spe.lra.run_lra` (one experiment) and
:func:`spe.lra.study.run_study` (``--plan``: the rows of a study plan).

Runs under ``torchrun`` as ``spe train`` does (e.g. ``torchrun --nproc-per-node 2 -m spe lra ...``):
each seed's batch is shared between the processes and only rank 0 writes files.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

__all__ = ["add_lra_parser", "cmd_lra", "default_out"]

_TASKS = ("listops", "text", "retrieval", "image")


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--seeds takes comma-separated integers, e.g. 0,1,2; got {text!r}") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds takes distinct integers ≥ 0, got {text!r}")
    return seeds


# Flags that define an experiment: a study plan sets them per row, so they are refused beside --plan.
_EXPERIMENT_FLAGS = ("task", "positional", "attention", "decay", "preset", "listops_pipeline", "batch_size",
                     "eval_every", "max_length", "num_realizations", "model_option", "positional_lr_scale")
# Options of a run that --plan passes on to every row.
_RUN_FLAGS = ("data", "steps", "device", "precision", "keep_checkpoints")


def _model_options(args: argparse.Namespace) -> dict:
    """--decay and every --model-option KEY=VALUE as one dict of model options."""
    from spe.lra.config import parse_model_option

    options = {"decay": args.decay} if args.decay else {}
    for text in args.model_option or []:
        key, value = parse_model_option(text)
        if key in options and options[key] != value:
            given = (f"--decay {args.decay}" if key == "decay" and args.decay
                     else f"--model-option {key}={options[key]!r}")
            raise ValueError(f"--model-option {key}={value!r} contradicts {given}; give one value")
        options[key] = value
    return options


def _folder_part(value) -> str:
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return "".join(c if c.isalnum() or c in "._+" else "_" for c in text)


def default_out(args: argparse.Namespace, model_options: dict, positional_lr_scale: float) -> Path:
    """runs/lra/PRESET/TASK-ATTENTION-POSITIONAL, + -lra-2021 for that pipeline, + -KEY-VALUE per
    model option (sorted by key; --decay none adds nothing, as before the option existed) and for a
    positional_lr_scale other than 1, so that two settings never share a default folder."""
    parts = {k: v for k, v in model_options.items() if not (k == "decay" and v == "none")}
    if positional_lr_scale != 1.0:
        parts["positional_lr_scale"] = positional_lr_scale
    pipeline = "" if args.listops_pipeline in (None, "lossless") else f"-{args.listops_pipeline}"
    suffix = "".join(f"-{key}-{_folder_part(parts[key])}" for key in sorted(parts))
    return Path(f"runs/lra/{args.preset or 'cpu-small'}/{args.task}-{args.attention or 'performer'}-"
                f"{args.positional or 'sinespe'}{pipeline}{suffix}")


def cmd_lra(args: argparse.Namespace) -> int:
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be positive, got {args.threads}")
    if args.plan or args.collect:
        return _cmd_plan(args)
    if args.only:
        raise ValueError("--only selects rows of a study plan: give --plan too")
    if args.task is None:
        raise ValueError("give --task (listops, text, retrieval, image) or a study --plan")
    return _cmd_experiment(args)


def _cmd_experiment(args: argparse.Namespace) -> int:
    from spe.lra import preset_config, run_lra

    if args.num_realizations is not None and args.num_realizations < 1:
        raise ValueError(f"--num-realizations must be positive, got {args.num_realizations}")
    model = _model_options(args)
    cfg = preset_config(args.task, args.positional or "sinespe", args.attention or "performer",
                        preset=args.preset or "cpu-small", data=args.data, steps=args.steps,
                        max_length=args.max_length, device=args.device, num_realizations=args.num_realizations,
                        batch_size=args.batch_size, eval_every=args.eval_every, precision=args.precision,
                        keep_checkpoints=args.keep_checkpoints, tensorboard=args.tensorboard or None,
                        compile=args.compile or None, listops_pipeline=args.listops_pipeline,
                        positional_lr_scale=args.positional_lr_scale, model=model or None)
    out = Path(args.out) if args.out else default_out(args, model, cfg.positional_lr_scale)
    summary = run_lra(cfg, _seeds(args.seeds or "0"), out, threads=args.threads, progress=not args.no_progress)
    if os.environ.get("RANK", "0") != "0":  # under torchrun rank 0 reports
        return 0
    print((out / "results.md").read_text(), end="")
    print(f"results: {out / 'results.json'} (mean {summary['mean']:.2f} ± {summary['std']:.2f} %)")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    """--plan: every row (or --only) of a study plan; --collect: only the results of what has run."""
    from spe.lra.study import load_study, run_study
    from spe.lra.study_results import collect_study

    if not args.plan:
        raise ValueError("--collect rebuilds the results of a study: give its --plan (and --out)")
    given = [f for f in _EXPERIMENT_FLAGS if getattr(args, f) not in (None, False, [])]
    if given:
        raise ValueError(f"--plan sets every experiment option per row; {', '.join(_flag(f) for f in given)} "
                         f"cannot be given with it (allowed: --only, --seeds, --out, --threads, --collect, "
                         f"{', '.join(_flag(f) for f in _RUN_FLAGS)}, --tensorboard, --compile, --no-progress)")
    plan = load_study(args.plan)
    out = Path(args.out or f"runs/lra/{plan.preset}/{Path(plan.path).stem}")
    if args.collect:
        collect_study(plan, out)
    else:
        only = [v.strip() for v in args.only.split(",") if v.strip()] if args.only else None
        run_study(plan, out, only=only, seeds=_seeds(args.seeds) if args.seeds else None, threads=args.threads,
                  progress=not args.no_progress, tensorboard=args.tensorboard or None, compile=args.compile or None,
                  **{f: getattr(args, f) for f in _RUN_FLAGS})
    if os.environ.get("RANK", "0") != "0":
        return 0
    print((out / "results.md").read_text(), end="")
    print(f"results: {out / 'results.json'}, {out / 'results.md'}, {out / 'loss.png'}")
    return 0


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_lra_parser(sub) -> None:
    p = sub.add_parser("lra", help="Long Range Arena: train encoder classifiers over seeds, test the best checkpoints")
    p.add_argument("--task", choices=_TASKS, help="the task (required unless --plan is given)")
    p.add_argument("--data", help="the task's folder in its official layout (default: the embedded data: "
                                  "generated ListOps, Text/Retrieval/Image proxies)")
    p.add_argument("--positional",
                   help="ape, ape-learned, sinespe, convspe, convspe-2d (image), rope, none; with linear kernels "
                        "also lrpe, permute, cosformer; with softmax also shaw, music-relative, alibi and the "
                        "SPE oracles sinespe-exact, convspe-exact (default sinespe)")
    p.add_argument("--attention", help="performer (default), linear-relu, linear-elu, softmax")
    p.add_argument("--decay", choices=("none", "fixed", "learned"),
                   help="decay γ^|m−n| on the lag (linear kernels): fixed (RetNet's γ_h = 1 − 2^(−5−h)) or learned "
                   "from there (default: the preset's, none)")
    p.add_argument("--preset", help="paper or cpu-small (default)")
    p.add_argument("--listops-pipeline", choices=("lossless", "lra-2021"),
                   help="ListOps tokens: lossless (every symbol, default) or lra-2021 (LRA's original words: "
                        "operators without '[', digits, no ']' and no parentheses)")
    p.add_argument("--seeds", help="comma-separated seeds, one run each (default 0; with --plan the plan's)")
    p.add_argument("--steps", type=int, help="optimizer steps per seed (default: the preset's)")
    p.add_argument("--batch-size", type=int, help="examples per step (default: the preset's)")
    p.add_argument("--eval-every", type=int, help="steps between validations (default: the preset's)")
    p.add_argument("--max-length", type=int, help="tokens per sequence / document (default: the preset's)")
    p.add_argument("--num-realizations", type=int, help="R for SPE (default: the preset's)")
    p.add_argument("--model-option", action="append", metavar="KEY=VALUE",
                   help="any model option of the classifier, e.g. gated=false, gate_init=-2, num_realizations=64, "
                        "code_noise=orthogonal, share_across_layers=true, frequency_init=spread, num_sines=20 "
                        "(VALUE read as TOML: true/false, numbers, else text; repeatable; wins over the preset)")
    p.add_argument("--positional-lr-scale", type=float,
                   help="learning-rate multiplier of the positional-encoding parameters (default 1)")
    p.add_argument("--out", help="experiment folder (default runs/lra/PRESET/TASK-ATTENTION-POSITIONAL, "
                                 "+ -lra-2021 with that ListOps pipeline, + -KEY-VALUE per model option and "
                                 "--decay fixed/learned, sorted by key, + -positional_lr_scale-X; with --plan: "
                                 "runs/lra/PRESET/PLAN)")
    p.add_argument("--plan", help="a study plan (TOML file, or a packaged one: listops-study): every row over its "
                                  "seeds into OUT/ROW (resumable), then OUT/results.json, results.md, loss.png")
    p.add_argument("--only", help="with --plan: comma-separated rows to run (default all); runners with disjoint "
                                  "lists may share --out")
    p.add_argument("--collect", action="store_true",
                   help="with --plan: train nothing, rebuild OUT/results.json, results.md and loss.png")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"),
                   help="fp32 (default), bf16 autocast (CPU or CUDA) or fp16 autocast with a gradient scaler (CUDA)")
    p.add_argument("--tensorboard", action="store_true",
                   help="also write TensorBoard scalars to OUT/seedK/tensorboard (needs: pip install 'spe[log]')")
    p.add_argument("--keep-checkpoints", type=int, help="checkpoints kept per seed in OUT/seedK/checkpoints (default 2)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model for training (falls back to the uncompiled model with a warning)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_lra)

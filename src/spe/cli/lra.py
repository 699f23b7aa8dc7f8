"""``spe lra``: parsing and printing only; the work is :func:`spe.lra.run_lra`.

Runs under ``torchrun`` as ``spe train`` does (e.g. ``torchrun --nproc-per-node 2 -m spe lra ...``):
each seed's batch is shared between the processes and only rank 0 writes files.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

__all__ = ["add_lra_parser", "cmd_lra"]

_TASKS = ("listops", "text", "retrieval", "image")


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--seeds takes comma-separated integers, e.g. 0,1,2; got {text!r}") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds takes distinct integers ≥ 0, got {text!r}")
    return seeds


def cmd_lra(args: argparse.Namespace) -> int:
    from spe.lra import preset_config, run_lra

    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be positive, got {args.threads}")
    if args.num_realizations is not None and args.num_realizations < 1:
        raise ValueError(f"--num-realizations must be positive, got {args.num_realizations}")
    cfg = preset_config(args.task, args.positional, args.attention, preset=args.preset, data=args.data,
                        steps=args.steps, max_length=args.max_length, device=args.device,
                        num_realizations=args.num_realizations, batch_size=args.batch_size,
                        eval_every=args.eval_every, precision=args.precision, keep_checkpoints=args.keep_checkpoints,
                        tensorboard=args.tensorboard or None, compile=args.compile or None,
                        listops_pipeline=args.listops_pipeline,
                        model={"decay": args.decay} if args.decay else None)
    pipeline = "" if cfg.listops_pipeline == "lossless" else f"-{cfg.listops_pipeline}"
    decayed = f"-decay-{args.decay}" if args.decay not in (None, "none") else ""
    out = Path(args.out or f"runs/lra/{args.preset}/{args.task}-{args.attention}-{args.positional}{pipeline}{decayed}")
    summary = run_lra(cfg, _seeds(args.seeds), out, threads=args.threads, progress=not args.no_progress)
    if os.environ.get("RANK", "0") != "0":  # under torchrun rank 0 reports
        return 0
    print((out / "results.md").read_text(), end="")
    print(f"results: {out / 'results.json'} (mean {summary['mean']:.2f} ± {summary['std']:.2f} %)")
    return 0


def add_lra_parser(sub) -> None:
    p = sub.add_parser("lra", help="Long Range Arena: train encoder classifiers over seeds, test the best checkpoints")
    p.add_argument("--task", required=True, choices=_TASKS)
    p.add_argument("--data", help="the task's folder in its official layout (default: the embedded data: "
                                  "generated ListOps, Text/Retrieval/Image proxies)")
    p.add_argument("--positional", default="sinespe",
                   help="ape, ape-learned, sinespe, convspe, convspe-2d (image), rope, none; with linear kernels "
                        "also lrpe, permute, cosformer; with softmax also shaw, music-relative, alibi and the "
                        "SPE oracles sinespe-exact, convspe-exact (default sinespe)")
    p.add_argument("--attention", default="performer", help="performer, linear-relu, linear-elu, softmax")
    p.add_argument("--decay", choices=("none", "fixed", "learned"),
                   help="decay γ^|m−n| on the lag (linear kernels): fixed (RetNet's γ_h = 1 − 2^(−5−h)) or learned "
                   "from there (default: the preset's, none)")
    p.add_argument("--preset", default="cpu-small", help="paper or cpu-small (default)")
    p.add_argument("--listops-pipeline", choices=("lossless", "lra-2021"),
                   help="ListOps tokens: lossless (every symbol, default) or lra-2021 (LRA's original words: "
                        "operators without '[', digits, no ']' and no parentheses)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds, one run each (default 0)")
    p.add_argument("--steps", type=int, help="optimizer steps per seed (default: the preset's)")
    p.add_argument("--batch-size", type=int, help="examples per step (default: the preset's)")
    p.add_argument("--eval-every", type=int, help="steps between validations (default: the preset's)")
    p.add_argument("--max-length", type=int, help="tokens per sequence / document (default: the preset's)")
    p.add_argument("--num-realizations", type=int, help="R for SPE (default: the preset's)")
    p.add_argument("--out", help="experiment folder (default runs/lra/PRESET/TASK-ATTENTION-POSITIONAL, "
                                 "+ -lra-2021 with that ListOps pipeline, + -decay-MODE for --decay fixed or learned)")
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

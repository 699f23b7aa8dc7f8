"""The plan flags every command that runs plans shares (``spe sweep``, ``spe lra --plan``,
``spe synth --plan``) and the one command path behind them: parsing and printing only; the work is
:func:`spe.lab.plans.run` (rows × seeds, resumable) and :func:`spe.lab.plans.collect_results`
(``--collect``: the results of what has run)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

__all__ = ["add_plan_flags", "cmd_plan"]


def add_plan_flags(p: argparse.ArgumentParser, task: str, *, default: str | None = None,
                   experiment: bool = False, seeds_note: str = "") -> None:
    """``--plan`` (naming the task's packaged plans, ``default`` the plan run without one), ``--only``,
    ``--collect`` and ``--seeds`` (``experiment``: the command also runs one experiment without a
    plan, on seed 0 by default; ``seeds_note``: what else the command does with them)."""
    from spe.lab.plans import packaged_plans

    names = ", ".join(packaged_plans(task))
    rows = "plan TOML, or the name of a packaged plan: " + names
    p.add_argument("--plan", default=default, help=rows + (f" (default {default})" if default else "")
                   + ": rows × seeds into OUT/ROW, then OUT/results.*")
    p.add_argument("--only", help="with --plan: comma-separated rows to run (disjoint lists may share --out)")
    p.add_argument("--collect", action="store_true", help="with --plan: train nothing, rebuild OUT's results")
    p.add_argument("--seeds", help="comma-separated seeds, one run each (default "
                   + ("0; with --plan the plan's" if experiment else "the plan's") + seeds_note + ")")


def cmd_plan(args: argparse.Namespace, task: str, given: list[str] = ()) -> int:
    """Runs (or ``--collect``s) ``args.plan`` of ``task`` into ``--out`` (default ``runs/TASK/PLAN``),
    then prints its results table and files.

    Args:
        given: the experiment flags the command line gave, which a plan sets per row (refused).

    Raises:
        ValueError: without ``--plan``, on a ``given`` flag, or as :func:`spe.lab.plans.run`.
    """
    from spe.lab import plans
    from spe.lab.options import parse_seeds

    cls = plans.plan_task(task)
    if not args.plan:
        raise ValueError(f"--only and --collect select rows of a {cls.format.kind}: give --plan")
    if given:
        raise ValueError(f"a {cls.format.kind} sets {', '.join(given)} per row: leave them out, or write a plan")
    plan = plans.load_plan(args.plan, task)
    out = Path(args.out) if args.out else cls.default_out(plan)
    # a flag left out is None, a switch left off False: the plan's value either way
    options = {k: v for k in cls.run_options if k != "threads" and (v := getattr(args, k, None)) not in (None, False)}
    if args.collect:
        plans.collect_results(plan, out, **options)
    else:
        only = [v.strip() for v in args.only.split(",") if v.strip()] if args.only else None
        plans.run(plan, out, only=only, seeds=parse_seeds(args.seeds) if args.seeds else None, threads=args.threads,
                  progress=not args.no_progress, **options)
    if os.environ.get("RANK", "0") == "0":  # under torchrun rank 0 reports
        markdown = out / "results.md"
        print(markdown.read_text() if markdown.is_file() else "no run has finished yet", end="")
        print("results: " + ", ".join(str(out / f) for f in (*plans.RESULTS_FILES, *cls.figures)
                                      if (out / f).is_file()))
    return 0

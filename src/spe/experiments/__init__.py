"""Experiments built from training and evaluation: plans of variants × seeds (``spe sweep``) and the demo.

This layer sits above :mod:`spe.train` and :mod:`spe.evaluation` (it uses both) and below
:mod:`spe.cli`, so that neither of those two imports the other.
"""

from spe.experiments.sweep import Plan, load_plan, results_table, run_sweep, summarize_runs, write_results

__all__ = ["Plan", "load_plan", "results_table", "run_sweep", "summarize_runs", "write_results"]

"""Experiments built from training and evaluation: plans of variants × seeds (``spe sweep``) and the demo.

This layer sits above :mod:`spe.lab.train` and :mod:`spe.lab.evaluation` (it uses both) and below
:mod:`spe.lab.cli`, so that neither of those two imports the other.
"""

from spe.lab.experiments.sweep import (Plan, collect_sweep, load_plan, results_table, run_sweep, summarize_runs,
                                       write_results)

__all__ = ["Plan", "collect_sweep", "load_plan", "results_table", "run_sweep", "summarize_runs", "write_results"]

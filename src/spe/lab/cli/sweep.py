"""Former home of ``spe sweep``'s library code, kept so that existing imports keep working.

Plans, runs and result tables live in :mod:`spe.lab.experiments.sweep`.
"""

from spe.lab.experiments.sweep import Plan, load_plan, results_table, run_sweep, summarize, write_results

__all__ = ["Plan", "load_plan", "results_table", "run_sweep", "summarize", "write_results"]

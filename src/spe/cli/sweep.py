"""Former home of ``spe sweep``'s library code, kept so that existing imports keep working.

Plans, runs and result tables live in :mod:`spe.experiments.sweep`.
"""

from spe.experiments.sweep import Plan, load_plan, results_table, run_sweep, summarize, write_results

__all__ = ["Plan", "load_plan", "results_table", "run_sweep", "summarize", "write_results"]

"""Former home of ``spe report``'s library code, kept so that existing imports keep working.

The report lives in :mod:`spe.evaluation.report`; probing in :mod:`spe.metrics.pe_probe`;
the R grid in :mod:`spe.evaluation.r_grid`; publishing in :mod:`spe.evaluation.publish`.
"""

from spe.evaluation.publish import publish_report
from spe.evaluation.r_grid import r_grids
from spe.evaluation.report import build_report
from spe.metrics.pe_probe import pe_metrics, probe_plan, probe_tokens

__all__ = ["build_report", "pe_metrics", "probe_plan", "probe_tokens", "publish_report", "r_grids"]

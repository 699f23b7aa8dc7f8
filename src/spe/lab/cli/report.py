"""Former home of ``spe report``'s library code, kept so that existing imports keep working.

The report lives in :mod:`spe.lab.evaluation.report`; probing in :mod:`spe.lab.metrics.pe_probe`;
the R grid in :mod:`spe.lab.evaluation.r_grid`; publishing in :mod:`spe.lab.evaluation.publish`.
"""

from spe.lab.evaluation.publish import publish_report
from spe.lab.evaluation.r_grid import r_grids
from spe.lab.evaluation.report import build_report
from spe.lab.metrics.pe_probe import pe_metrics, probe_plan, probe_tokens

__all__ = ["build_report", "pe_metrics", "probe_plan", "probe_tokens", "publish_report", "r_grids"]

"""The one statistics convention of every results table: mean ± sample standard deviation over seeds.

Every table and summary of the lab (``spe sweep``, ``spe lra``, an LRA study, the documentation
scripts) reports a spread over seeds the same way, so that numbers from different pages compare:
the sample standard deviation (Bessel's n − 1), which estimates the spread of a further seed;
it does not exist for one seed, which is written ``–`` (NaN in memory, ``null`` in strict JSON).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

__all__ = ["SEED_SPREAD", "format_mean_std", "mean_and_std"]

# The phrase every table header or caption uses for its "m ± s" cells.
SEED_SPREAD = "mean ± sample std (n − 1) over seeds; – for one seed"


def mean_and_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1) of per-seed values.

    Args:
        values: one value per seed (n ≥ 1).

    Returns:
        ``(mean, std)``; ``std`` is NaN for a single value (no spread to estimate).

    Raises:
        ValueError: if ``values`` is empty.
    """
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_and_std needs at least one value (one per seed), got none")
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else math.nan)


def format_mean_std(mean: float, std: float | None, *, digits: int = 2, signed: bool = False) -> str:
    """``"m ± s"`` with ``digits`` decimals, ``"m ± –"`` where there is no spread.

    Args:
        mean: the mean.
        std: the standard deviation; None or NaN (one seed) is written ``–``.
        digits: decimals of both numbers.
        signed: write the mean's sign even when positive (``+4.1 ± 0.5``), for differences.

    Raises:
        ValueError: if ``digits`` is negative.
    """
    if digits < 0:
        raise ValueError(f"digits must be ≥ 0, got {digits}")
    spread = "–" if std is None or math.isnan(std) else f"{std:.{digits}f}"
    return f"{mean:{'+' if signed else ''}.{digits}f} ± {spread}"

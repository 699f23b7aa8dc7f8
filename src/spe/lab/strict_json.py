"""Strict JSON output: no ``NaN``/``Infinity`` literals, which standard JSON parsers reject.

A statistic that does not exist (the standard deviation of one sequence, the mean of an
empty range) is computed as NaN; it is written as ``null``.
"""

from __future__ import annotations

import json
import math

__all__ = ["dumps", "finite_or_none"]


def finite_or_none(value):
    """``value`` with every non-finite float (NaN, ±inf) inside dicts, lists and tuples replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def dumps(value, **kwargs) -> str:
    """``json.dumps`` of :func:`finite_or_none` (value), refusing any non-finite float that is left."""
    return json.dumps(finite_or_none(value), allow_nan=False, **kwargs)

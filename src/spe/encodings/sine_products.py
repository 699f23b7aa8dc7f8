"""Moved to :mod:`spe.ops.sine_products` (beside their reference twin); re-exported for old imports."""

from spe.ops.sine_products import FusedSineProduct, SharedSineProduct

__all__ = ["FusedSineProduct", "SharedSineProduct"]

"""Moved to :mod:`spe.ops.phases` (kernels below the encodings); re-exported for old imports."""

from spe.ops.phases import sine_features, sine_phase

__all__ = ["sine_features", "sine_phase"]

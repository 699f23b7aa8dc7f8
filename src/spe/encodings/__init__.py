"""Positional encodings, named by where they act.

* Added to tokens: :class:`SinusoidalPositionalEncoding`.
* Transforming queries and keys: :class:`SineSPE`, :class:`ConvSPE` (codes) applied by
  :class:`SPEFilter`.
"""

from spe.encodings.absolute import SinusoidalPositionalEncoding
from spe.encodings.code import DenseCode, SineCode, SPECode
from spe.encodings.conv import ConvSPE
from spe.encodings.filter import SPEFilter, apply_code_reference, apply_sine_code_fused
from spe.encodings.sine import SineSPE, sine_phase

__all__ = [
    "ConvSPE", "DenseCode", "SPECode", "SPEFilter", "SineCode", "SineSPE",
    "SinusoidalPositionalEncoding", "apply_code_reference", "apply_sine_code_fused", "sine_phase",
]

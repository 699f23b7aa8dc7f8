"""Positional encodings, named by where they act.

* Added to tokens: :class:`SinusoidalPositionalEncoding`, :class:`LearnedPositionalEmbedding`.
* Transforming queries and keys: :class:`SineSPE`, :class:`ConvSPE` (codes) applied by
  :class:`SPEFilter`; :class:`RotaryEncoding` (RoPE).
* A term in the attention scores (softmax only): :class:`ShawRelativePosition`,
  :class:`MusicRelativePosition`, :class:`ALiBi`; :class:`PathEncoding` (PaTH: Householder
  products between key and query, from the layer's input; decoding state :class:`PathCache`).
* Transforming the kernel's features φ (linear kernels only): :class:`LRPE`,
  :class:`PermuteFeatures` (PermuteFormer), :class:`CosFormerReweighting`.
* Mixing each projected query, key and value with its K − 1 predecessors, before all of the
  above: :class:`ShortConvolution` (fla's short convolution; decoding state
  :class:`ShortConvState`).
* Forget gates from the layer's input, weighing the kernel's sums (``decay="gated"``,
  ``"gated-channel"``): :class:`ScalarGate` (Mamba2's), :class:`ChannelGate` (GLA's).
* Learned time (``spe_time``, ``rope_time``): a :class:`LearnedClock` per layer, read by
  :class:`LearnedTimeSPEFilter` (sineSPE) and :class:`LearnedTimeRotary` (RoPE).
* What an attention layer asks of its positional module: :class:`LayerEncoding` (its decoding
  state in an :class:`EncodingState`).

The functions that apply a code live with their kernels in :mod:`spe.ops.sine`;
:func:`apply_code_reference` and :func:`apply_sine_code_fused` are re-exported here, where they
were first public, as is :func:`sine_phase` (:mod:`spe.ops.sine.phases`).
"""

from spe.encodings.absolute import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from spe.encodings.alibi import ALiBi, alibi_slopes
from spe.encodings.code import DenseCode, SineCode, SPECode
from spe.encodings.conv import ConvSPE
from spe.encodings.clock import LearnedClock
from spe.encodings.cosformer import CosFormerReweighting
from spe.encodings.filter import SPEFilter
from spe.encodings.gates import ChannelGate, ScalarGate
from spe.encodings.lrpe import LRPE
from spe.encodings.music_relative import MusicRelativePosition
from spe.encodings.path import PathCache, PathEncoding
from spe.encodings.permute import PermuteFeatures
from spe.encodings.registry import POSITIONAL_SPECS, PositionalSpec, positional_names, positional_spec
from spe.encodings.rope import LearnedTimeRotary, RotaryEncoding, rotate
from spe.encodings.shaw import ShawRelativePosition
from spe.encodings.short_conv import ShortConvolution, ShortConvState, depthwise_conv, depthwise_conv_reference
from spe.encodings.sine import LearnedTimeSPEFilter, SineSPE, sine_phase
from spe.encodings.spec import EncodingState, LayerEncoding
from spe.ops.sine.apply import apply_sine_code_fused
from spe.ops.sine.naive import apply_code_reference

__all__ = [
    "LRPE", "ALiBi", "ChannelGate", "ConvSPE", "CosFormerReweighting", "DenseCode", "EncodingState", "LayerEncoding",
    "LearnedClock", "LearnedTimeRotary", "LearnedTimeSPEFilter", "PermuteFeatures", "LearnedPositionalEmbedding", "MusicRelativePosition", "RotaryEncoding",
    "POSITIONAL_SPECS", "PathCache", "PathEncoding", "PositionalSpec", "SPECode", "SPEFilter", "ScalarGate", "ShawRelativePosition", "ShortConvState",
    "ShortConvolution", "SineCode", "SineSPE", "SinusoidalPositionalEncoding",
    "alibi_slopes", "apply_code_reference", "apply_sine_code_fused", "depthwise_conv", "depthwise_conv_reference",
    "positional_names", "positional_spec", "rotate",
    "sine_phase",
]

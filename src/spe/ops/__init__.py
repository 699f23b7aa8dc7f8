"""Pure attention kernels and feature maps. Layout: (batch, length, num_heads, dim).

One mechanism a folder (fla's layout): :mod:`spe.ops.linear_attn`, :mod:`spe.ops.decay`,
:mod:`spe.ops.softmax`, :mod:`spe.ops.path`, :mod:`spe.ops.relative`, :mod:`spe.ops.sine`,
:mod:`spe.ops.fourier` (FNet's token mixing, (batch, length, channels)); each
with a float64 reference (``naive``), its fast forms (``chunk``, ``parallel``, ``fused`` …) and,
where it decodes, the step (``recurrent``); :mod:`spe.ops.common` holds what they share (chunked
sums, checks, feature maps, decoding states). :mod:`spe.ops.linear` and :mod:`spe.ops.recurrent`
are public aliases at earlier paths, for user code only (the library imports the folders).
"""

from spe.ops.common.feature_maps import (
    ScaledFeatures,
    elu_feature_map,
    favor_feature_map,
    favor_key_features,
    orthogonal_random_features,
    relu_feature_map,
)
from spe.ops.common.state import (
    AttentionState,
    KVCache,
    LinearAttentionState,
    RecentKeys,
    ScaledLinearAttentionState,
    ScaledRecentKeys,
)
from spe.ops.fourier import FourierState, fourier_mixing, fourier_mixing_step
from spe.ops.linear_attn import (
    causal_linear_attention,
    causal_linear_attention_reference,
    causal_linear_attention_with_state,
    kernel_dtype,
    linear_attention,
    linear_attention_step,
    normalise,
)
from spe.ops.path import path_attention, path_attention_step, path_prefill_cache
from spe.ops.relative import (
    music_relative_attention,
    music_relative_attention_reference,
    relative_shift,
    shaw_attention,
    skew,
)
from spe.ops.softmax import append_to_cache, prefill_cache, softmax_attention, softmax_attention_step

__all__ = [
    "AttentionState", "FourierState", "KVCache", "LinearAttentionState", "RecentKeys", "ScaledFeatures",
    "ScaledLinearAttentionState", "ScaledRecentKeys", "append_to_cache", "causal_linear_attention", "causal_linear_attention_reference",
    "causal_linear_attention_with_state", "elu_feature_map", "favor_feature_map", "favor_key_features",
    "fourier_mixing", "fourier_mixing_step",
    "kernel_dtype", "linear_attention", "linear_attention_step", "music_relative_attention",
    "music_relative_attention_reference", "normalise", "orthogonal_random_features", "path_attention",
    "path_attention_step", "path_prefill_cache", "prefill_cache", "relative_shift",
    "relu_feature_map", "shaw_attention", "skew", "softmax_attention", "softmax_attention_step",
]

"""Pure attention kernels and feature maps. Layout: (batch, length, num_heads, dim)."""

from spe.ops.feature_maps import (
    elu_feature_map,
    favor_feature_map,
    orthogonal_random_features,
    relu_feature_map,
)
from spe.ops.linear import causal_linear_attention, causal_linear_attention_reference, linear_attention
from spe.ops.relative import (
    music_relative_attention,
    music_relative_attention_reference,
    relative_shift,
    shaw_attention,
    skew,
)
from spe.ops.softmax import softmax_attention

__all__ = [
    "causal_linear_attention", "causal_linear_attention_reference", "elu_feature_map",
    "favor_feature_map", "linear_attention", "music_relative_attention", "music_relative_attention_reference",
    "orthogonal_random_features", "relative_shift", "relu_feature_map", "shaw_attention", "skew",
    "softmax_attention",
]

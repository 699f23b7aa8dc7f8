"""Linear attention's public names at their earlier path: the kernels now live in
:mod:`spe.ops.linear_attn` (one mechanism a folder); this module re-exports them so that
``spe.ops.linear`` keeps working."""

from spe.ops.linear_attn import (
    LinearState,
    causal_linear_attention,
    causal_linear_attention_reference,
    causal_linear_attention_with_state,
    check_linear_state,
    check_normalize,
    check_normaliser_features,
    kernel_dtype,
    linear_attention,
    normalise,
    rescale_keys,
    to_plain_state,
    to_scaled_state,
    unchecked_causal_linear_attention_with_state,
    unchecked_linear_attention,
)

__all__ = ["LinearState", "causal_linear_attention", "causal_linear_attention_reference",
           "causal_linear_attention_with_state", "check_linear_state", "check_normalize", "check_normaliser_features",
           "kernel_dtype", "linear_attention", "normalise", "rescale_keys", "to_plain_state", "to_scaled_state",
           "unchecked_causal_linear_attention_with_state", "unchecked_linear_attention"]

"""Public alias: linear attention's names at their earlier path ``spe.ops.linear``, which user
code may import. The kernels live in :mod:`spe.ops.linear_attn` (one mechanism a folder); this
module only re-exports them, and nothing inside :mod:`spe` imports it (tests/test_structure.py)."""

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

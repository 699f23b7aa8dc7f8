"""Linear attention (Katharopoulos et al. 2020), one mechanism: causal and non-causal, with a
window, key log scales (FAVOR+), a separate normaliser, and any of the decay forms of
:mod:`spe.ops.decay`.

Layout after fla's ``ops/<mechanism>``: :mod:`~spe.ops.linear_attn.naive` (the reference by
cumulative sums), :mod:`~spe.ops.linear_attn.chunk` (the chunked forms, what the layer runs),
:mod:`~spe.ops.linear_attn.recurrent` (the decoding step), :mod:`~spe.ops.linear_attn.options`
(the options record :class:`~spe.ops.linear_attn.options.LinearKernelOptions`, the normaliser
and the state helpers). :func:`~spe.ops.linear_attn.chunk.chunk_linear_attention` and
:func:`~spe.ops.linear_attn.recurrent.recurrent_linear_attention` share one signature,
``(phi_q, phi_k, v, normalizer, state, opts) -> (o, final_state)``. The chunked sums they
run are :mod:`spe.ops.common.chunk` and :mod:`spe.ops.common.scaled` (shared with the decay's).
"""

from spe.ops.linear_attn.chunk import (
    causal_linear_attention,
    causal_linear_attention_with_state,
    chunk_linear_attention,
    linear_attention,
    unchecked_causal_linear_attention_with_state,
    unchecked_linear_attention,
)
from spe.ops.linear_attn.naive import causal_linear_attention_reference
from spe.ops.linear_attn.options import (
    LinearKernelOptions,
    LinearState,
    check_linear_state,
    check_normalize,
    check_normaliser_features,
    kernel_dtype,
    normalise,
    rescale_keys,
    to_plain_state,
    to_scaled_state,
)
from spe.ops.linear_attn.recurrent import (
    linear_attention_step,
    recurrent_linear_attention,
    unchecked_linear_attention_step,
)

__all__ = ["LinearKernelOptions", "LinearState", "causal_linear_attention", "causal_linear_attention_reference",
           "causal_linear_attention_with_state", "check_linear_state", "check_normalize", "check_normaliser_features",
           "chunk_linear_attention", "kernel_dtype", "linear_attention", "linear_attention_step", "normalise",
           "recurrent_linear_attention", "rescale_keys", "to_plain_state", "to_scaled_state",
           "unchecked_causal_linear_attention_with_state", "unchecked_linear_attention",
           "unchecked_linear_attention_step"]

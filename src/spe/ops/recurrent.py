"""The decoding steps at their earlier path: softmax's (:mod:`spe.ops.softmax.recurrent`) and
linear attention's (:mod:`spe.ops.linear_attn.recurrent`), re-exported so that
``spe.ops.recurrent`` keeps working."""

from spe.ops.linear_attn.recurrent import linear_attention_step, unchecked_linear_attention_step
from spe.ops.softmax.recurrent import append_to_cache, prefill_cache, softmax_attention_step

__all__ = ["append_to_cache", "linear_attention_step", "prefill_cache", "softmax_attention_step",
           "unchecked_linear_attention_step"]

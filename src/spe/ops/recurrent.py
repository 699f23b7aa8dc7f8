"""Public alias: the decoding steps at their earlier path ``spe.ops.recurrent``, which user code
may import. They live in :mod:`spe.ops.softmax.recurrent` and
:mod:`spe.ops.linear_attn.recurrent`; this module only re-exports them, and nothing inside
:mod:`spe` imports it (tests/test_structure.py)."""

from spe.ops.linear_attn.recurrent import linear_attention_step, unchecked_linear_attention_step
from spe.ops.softmax.recurrent import append_to_cache, prefill_cache, softmax_attention_step

__all__ = ["append_to_cache", "linear_attention_step", "prefill_cache", "softmax_attention_step",
           "unchecked_linear_attention_step"]

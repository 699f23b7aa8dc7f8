"""PaTH attention (Yang et al. 2025): softmax attention whose logits carry the cumulative
product of data-dependent Householder-like matrices H_t = I − β_t w_t w_tᵀ between key and query.

Layout after fla's ``ops/path_attn``: :mod:`~spe.ops.path.naive` (the O(L²·D) definition, the
float64 reference), :mod:`~spe.ops.path.chunk` (the UT-transform chunked form, and
:func:`path_attention`, which picks it or the flash-style form by length),
:mod:`~spe.ops.path.flash` (query blocks against key tiles with an online softmax, recomputed
in backward: O(L·D) memory kept), :mod:`~spe.ops.path.recurrent` (decoding from a cache of
transformed keys).
"""

from spe.ops.path.chunk import path_attention, path_logits, path_transformed_keys
from spe.ops.path.naive import path_attention_reference, path_logits_reference
from spe.ops.path.recurrent import path_attention_step, path_prefill_cache

__all__ = ["path_attention", "path_attention_reference", "path_attention_step", "path_logits",
           "path_logits_reference", "path_prefill_cache", "path_transformed_keys"]

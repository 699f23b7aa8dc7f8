"""Softmax attention, one mechanism: exact attention with a window, key padding and FoX's forget
gate (Lin et al. 2025).

Layout after fla's ``ops/<mechanism>``: :mod:`~spe.ops.softmax.naive` (the float64 O(L²)
reference, FoX's too), :mod:`~spe.ops.softmax.chunk` (PyTorch's fused kernel; FoX's bias on
short sequences), :mod:`~spe.ops.softmax.flash` (FoX on long ones in O(L) memory: the gate as one
more coordinate of q and k, blocks of queries, recomputed in backward),
:mod:`~spe.ops.softmax.recurrent` (decoding from a KV cache),
:mod:`~spe.ops.softmax.flex` (FlexAttention: FoX's gate and score terms as a ``score_mod``, CUDA's path),
:mod:`~spe.ops.softmax.local` (the Music Transformer's block-local attention, blocks batched; its decoding
cache of at most two blocks).
"""

from spe.ops.common.checks import check_window
from spe.ops.softmax.chunk import (
    FLASH_FOX_MIN_LENGTH,
    FOX_QUERY_BLOCK,
    attend,
    check_key_padding_mask,
    gate_bias,
    softmax_attention,
    softmax_gates,
)
from spe.ops.softmax.flash import FLASH_FOX_BLOCK, flash_fox_attention
from spe.ops.softmax.flex import SOFTMAX_IMPLS, flex_softmax_attention
from spe.ops.softmax.local import block_local_attention, block_local_step
from spe.ops.softmax.naive import block_local_reference, gated_softmax_reference, softmax_attention_reference
from spe.ops.softmax.recurrent import append_to_cache, prefill_cache, softmax_attention_step

__all__ = ["FLASH_FOX_BLOCK", "block_local_attention", "block_local_reference", "block_local_step", "FLASH_FOX_MIN_LENGTH", "FOX_QUERY_BLOCK", "SOFTMAX_IMPLS", "append_to_cache",
           "attend", "check_key_padding_mask", "check_window", "flash_fox_attention", "flex_softmax_attention",
           "gate_bias", "gated_softmax_reference", "prefill_cache", "softmax_attention", "softmax_attention_reference",
           "softmax_attention_step", "softmax_gates"]

"""Decay in linear attention, one mechanism: RetNet's constant decay on the lag, and the
data-dependent scalar and channel gates (Mamba2, GLA), as named forms decoded once.

Layout after fla's ``ops/<mechanism>``: :mod:`~spe.ops.decay.forms` (the forms, the decoding of
``log_decay`` and its checks), :mod:`~spe.ops.decay.naive` (the float64 O(L²) reference of every
form), :mod:`~spe.ops.decay.chunk` (the constant decay's chunked helpers),
:mod:`~spe.ops.decay.gated` (the gates' chunked sums) and :mod:`~spe.ops.decay.sums` (the segment
and suffix sums of log gates, each from its own terms). The kernels that run them are
:mod:`spe.ops.linear_attn`'s, whose recurrent step reads the same forms.
"""

from spe.ops.decay.chunk import bidirectional_decay_sums, decayed_running_max
from spe.ops.decay.forms import (
    DECAY_MODES,
    FLOOR_LOG_SCALE,
    NO_DECAY,
    ChannelGate,
    ConstantDecay,
    Decay,
    ScalarGate,
    check_decay_mode,
    check_gates,
    check_log_decay,
    decay_form,
    decode_decay,
    given_form,
    is_gate,
    retnet_decay_logits,
    retnet_log_decay,
)
from spe.ops.decay.naive import decay_attention_reference
from spe.ops.decay.sums import segment_sums, suffix_sums

__all__ = ["DECAY_MODES", "FLOOR_LOG_SCALE", "NO_DECAY", "ChannelGate", "ConstantDecay", "Decay", "ScalarGate",
           "bidirectional_decay_sums", "check_decay_mode", "check_gates", "check_log_decay",
           "decay_attention_reference", "decay_form", "decayed_running_max", "decode_decay", "given_form",
           "is_gate", "retnet_decay_logits", "retnet_log_decay", "segment_sums", "suffix_sums"]

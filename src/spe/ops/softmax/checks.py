"""The checks every softmax path shares: FoX's gates on the logits and the key padding mask
(:mod:`spe.ops.softmax.chunk`, :mod:`spe.ops.softmax.flash`, :mod:`spe.ops.softmax.flex`,
:mod:`spe.ops.softmax.recurrent`)."""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.decay.forms import check_gates, check_log_decay, is_gate

__all__ = ["check_key_padding_mask", "softmax_gates"]


def softmax_gates(log_decay: Tensor, shape: tuple[int, ...]) -> Tensor:
    """A forget gate for queries of shape (B, L, H, D), as (B, L, H): (B, L, H) as given, (H,)
    a constant one.

    Raises:
        ValueError: naming the shape received and those allowed ((H,), (B, L, H): a gate per
            feature channel has no meaning on logits), or a value not finite or > 0.
    """
    if is_gate(log_decay):
        return check_gates(log_decay, shape, channel=False)[..., 0]
    check_log_decay(log_decay, shape[2])
    return log_decay.expand(*shape[:3])


def check_key_padding_mask(key_padding_mask: Tensor, k: Tensor) -> Tensor:
    """Validates a key padding mask for keys ``k`` (B, Lk, H, E), as every softmax path with a
    score term does (:mod:`spe.attention.kernels`).

    Args:
        key_padding_mask: (B, Lk) bool, True at padding keys.
        k: the keys it masks.

    Returns:
        (B, 1, 1, Lk) bool, True where attention is allowed.

    Raises:
        ValueError: naming the shape and dtype received, unless the mask is (B, Lk) bool.
    """
    if key_padding_mask.shape != k.shape[:2] or key_padding_mask.dtype != torch.bool:
        raise ValueError(f"key_padding_mask must be a (batch, keys) = {tuple(k.shape[:2])} bool tensor, got "
                         f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}")
    return ~key_padding_mask[:, None, None, :]

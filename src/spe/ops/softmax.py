"""Exact softmax attention, the reference and baseline. Letters: B, L, H, E as elsewhere."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["softmax_attention"]


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """softmax(q kᵀ / √E) v, with PyTorch's fused kernel.

    Args:
        q: (B, L, H, E).
        k: (B, L, H, E).
        v: (B, L, H, Ev).
        causal: mask keys after each query.

    Returns:
        (B, L, H, Ev).
    """
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=causal)
    return out.transpose(1, 2)

"""What the relative-position kernels share: the checks of queries, keys and values, and the key
padding on logits. Letters: B = batch, Lq/Lk = queries/keys, H = num_heads, D = head_dim."""

from __future__ import annotations

from torch import Tensor

__all__ = ["check_pair", "mask_padding"]


def check_pair(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Queries (B, Lq, H, D), keys (B, Lk, H, D), values (B, Lk, H, Dv)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:] \
            or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"queries, keys, values must be (batch, length, num_heads, head_dim) with matching "
                         f"batch, heads, head_dim and key/value lengths, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")


def mask_padding(logits: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """(B, H, Lq, Lk) logits (or a broadcastable bias) with −∞ at padding keys ((B, Lk) bool, True
    at padding); unchanged without a mask."""
    if key_padding_mask is None:
        return logits
    return logits.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))

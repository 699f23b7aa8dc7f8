"""The explicit twin of Music Transformer's relative attention (Huang et al. 2018): the relative
embeddings gathered for every (query, key) pair, (Lq, Lk, H, D). Letters as in
:mod:`spe.ops.relative.parallel`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.relative.checks import check_pair, mask_padding

__all__ = ["music_relative_attention_reference"]


def music_relative_attention_reference(q: Tensor, k: Tensor, v: Tensor, rel_keys: Tensor, *, causal: bool,
                                       query_offset: int = 0, key_padding_mask: Tensor | None = None) -> Tensor:
    """Explicit twin of :func:`~spe.ops.relative.parallel.music_relative_attention`: gathers e_{j−i}
    for every pair.

    Args:
        q: (B, Lq, H, D) queries at positions query_offset … query_offset + Lq − 1.
        k: (B, Lk, H, D) keys at positions 0 … Lk − 1.
        v: (B, Lk, H, Dv).
        rel_keys: (W, H, D) embeddings by increasing r, for r = −(Lq + query_offset − 1) … 0
            when causal (W = Lq + query_offset), … Lk − 1 otherwise (W = Lq + query_offset + Lk − 1).
        causal: mask keys after each query.
        query_offset: position of the first query (a decoding step has Lq = 1, offset t).
        key_padding_mask: (B, Lk) bool, True at padding keys (no weight).

    Returns:
        (B, Lq, H, Dv).
    """
    check_pair(q, k, v)
    lq, lk, d = q.shape[1], k.shape[1], q.shape[-1]
    lowest = -(lq + query_offset - 1)
    width = lq + query_offset + (0 if causal else lk - 1)
    if rel_keys.shape != (width, q.shape[2], d):
        raise ValueError(f"rel_keys must be ({width}, {q.shape[2]}, {d}) for {lq} queries from position "
                         f"{query_offset} and {lk} keys, got {tuple(rel_keys.shape)}")
    i = torch.arange(lq, device=q.device)[:, None] + query_offset
    j = torch.arange(lk, device=q.device)[None, :]
    rel = (j - i).clamp(max=0) if causal else j - i  # masked entries index a valid row
    gathered = rel_keys[rel - lowest]  # (Lq, Lk, H, D)
    logits = (torch.einsum("bihd,bjhd->bhij", q, k) + torch.einsum("bihd,ijhd->bhij", q, gathered)) * d**-0.5
    if causal:
        logits = logits.masked_fill(j > i, float("-inf"))
    logits = mask_padding(logits, key_padding_mask)
    return torch.einsum("bhij,bjhe->bihe", logits.softmax(dim=-1), v)

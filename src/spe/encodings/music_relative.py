"""Relative attention of Music Transformer (Huang et al. 2018), keys only, via skewing.

Letters: B = batch, L = length, H = num_heads, D = head_dim, k = max_distance.

Each head learns an embedding e_r per relative position r = j − i, |r| ≤ k; farther ones
are clipped to r = ±k (the same meaning of k as Shaw's clipping distance), so the model
runs at any length. The relative
scores come from Q Eᵀ and the skewing reshape (:func:`spe.ops.relative.skew`): memory
O(L·D) beyond the L × L scores that softmax attention has anyway. Softmax attention only.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from spe.encodings.positions import require_positive
from spe.ops.relative import music_relative_attention, music_relative_attention_reference
from spe.ops.softmax.local import relative_block_attention
from spe.encodings.shaw import RelativeDistanceOptions
from spe.encodings.spec import PositionalSpec, ScoreEncoding, head_dim

__all__ = ["MusicRelativePosition", "SPEC"]


class MusicRelativePosition(ScoreEncoding):
    """Per-head relative key embeddings E.

    Args:
        num_heads: H.
        head_dim: D.
        max_distance: k, learned relative positions |r| ≤ k (k + 1 embeddings when causal,
            2k + 1 otherwise).
        causal: only r ≤ 0; otherwise both directions.

    Raises:
        ValueError: if a size is not a positive integer.
    """

    def __init__(self, num_heads: int, head_dim: int, max_distance: int, *, causal: bool = True) -> None:
        super().__init__()
        require_positive("MusicRelativePosition", num_heads=num_heads, head_dim=head_dim,
                         max_distance=max_distance)
        self.max_distance, self.causal = max_distance, causal
        size = max_distance + 1 if causal else 2 * max_distance + 1
        self.embeddings = nn.Parameter(torch.randn(size, num_heads, head_dim) * 0.02)

    def _table(self, low: int, high: int) -> Tensor:
        """Embeddings for r = low … high (clipped to ±k), (high − low + 1, H, D)."""
        k = self.max_distance
        r = torch.arange(low, high + 1, device=self.embeddings.device).clamp(-k, k)
        return self.embeddings[r + k]

    def score_bias(self, q: Tensor, num_keys: int, *, query_offset: int = 0) -> Tensor:
        """The term this encoding adds to the scaled scores q·k/√D: q_i·e_{clip(j−i)}/√D (per head).

        Args:
            q: (B, Lq, H, D) queries at positions query_offset … query_offset + Lq − 1.
            num_keys: Lk, keys at positions 0 … Lk − 1.
            query_offset: position of the first query.

        Returns:
            (B, H, Lq, Lk); entries for future keys (causal) are meaningless (callers mask).
        """
        lq = q.shape[1]
        low = -(lq + query_offset - 1)
        high = 0 if self.causal else max(num_keys - 1 - query_offset, 0)  # causal: future pairs are masked
        table = self._table(low, high).to(q)  # (W, H, D), r = low … high
        per_rel = torch.einsum("bmhd,whd->bhmw", q, table)
        i = torch.arange(lq, device=q.device)[:, None] + query_offset
        rel = (torch.arange(num_keys, device=q.device)[None, :] - i).clamp(low, high) - low  # (Lq, Lk) columns
        return per_rel.gather(3, rel.expand(*per_rel.shape[:2], lq, num_keys)) / q.shape[-1] ** 0.5

    def flex_arguments(self, q: Tensor) -> dict:
        """This term for queries q (B, L, H, D) at positions 0 … L − 1 as keyword arguments of
        :func:`~spe.ops.softmax.flex.flex_softmax_attention`: the relative scores q_m·e_r/√D
        (B, L, H, R), r = −k … 0 (causal) or −k … k, in at least float32 (O(L·R) memory), k and
        causality; FlexAttention then equals :meth:`attend`."""
        k = self.max_distance
        table = self._table(-k, 0 if self.causal else k)  # (R, H, D)
        dtype = torch.promote_types(q.dtype, torch.float32)
        scores = torch.einsum("bmhd,rhd->bmhr", q.to(dtype), table.to(dtype)) / q.shape[-1] ** 0.5
        return {"relative_scores": scores, "max_distance": k, "causal": self.causal}

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, query_offset: int = 0,
               key_padding_mask: Tensor | None = None) -> Tensor:
        """Softmax attention with relative key terms.

        Args:
            q: (B, Lq, H, D) queries at positions query_offset … query_offset + Lq − 1.
            k: (B, Lk, H, D) keys at positions 0 … Lk − 1.
            v: (B, Lk, H, Dv) values.
            query_offset: position of the first query (decoding: Lq = 1, offset t).
            key_padding_mask: (B, Lk) bool, True at padding keys (no weight).

        Returns:
            (B, Lq, H, Dv).
        """
        lq, lk = q.shape[1], k.shape[1]
        low, high = -(lq + query_offset - 1), (0 if self.causal else lk - 1)
        table = self._table(low, high)
        if lq == lk and query_offset == 0:
            return music_relative_attention(q, k, v, table, causal=self.causal, key_padding_mask=key_padding_mask)
        if self.causal and lq > 1 and query_offset > 0 and lq + query_offset == lk:  # a block-local window's queries
            return relative_block_attention(q, k, v, table, key_padding_mask=key_padding_mask)
        return music_relative_attention_reference(q, k, v, table, causal=self.causal, query_offset=query_offset,
                                                  key_padding_mask=key_padding_mask)

    def extra_repr(self) -> str:
        return f"max_distance={self.max_distance}, causal={self.causal}"


SPEC = PositionalSpec("music-relative", "scores", source="Huang et al. 2018, skewing, O(LD) memory",
                      layer_module=lambda c, causal: MusicRelativePosition(c.num_heads, head_dim(c), c.max_distance,
                                                                           causal=causal),
                      options=(RelativeDistanceOptions,))

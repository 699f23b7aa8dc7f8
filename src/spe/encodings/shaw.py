"""Relative position representations of Shaw, Uszkoreit and Vaswani (2018), on keys and values.

Letters: B = batch, L = length, H = num_heads, D = head_dim, k = max_distance.

Relative positions j − i are clipped to [−k, k] (eq. (5)–(6) of Shaw et al.); the 2k + 1
(causal: k + 1) embeddings a^K, a^V are shared by all heads of a layer, as in the paper.
The scores are computed explicitly (:func:`spe.ops.relative.shaw_attention`), which costs
O(L²·D) memory: this is the baseline SPE is meant to replace. Softmax attention only.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch
from torch import Tensor, nn

from spe.encodings.positions import require_positive
from spe.ops.relative import shaw_attention
from spe.encodings.spec import PositionalSpec, ScoreEncoding, head_dim, option

__all__ = ["RelativeDistanceOptions", "ShawRelativePosition", "SPEC"]


class ShawRelativePosition(ScoreEncoding):
    """Learned relative embeddings a^K, a^V with clipping distance k.

    Args:
        head_dim: D.
        max_distance: k, the clipping distance.
        causal: only relative positions ≤ 0 exist (k + 1 embeddings instead of 2k + 1).

    Raises:
        ValueError: if a size is not a positive integer.
    """

    def __init__(self, head_dim: int, max_distance: int, *, causal: bool = True) -> None:
        super().__init__()
        require_positive("ShawRelativePosition", head_dim=head_dim, max_distance=max_distance)
        self.max_distance, self.causal = max_distance, causal
        size = max_distance + 1 if causal else 2 * max_distance + 1
        self.rel_keys = nn.Parameter(torch.randn(size, head_dim) * 0.02)
        self.rel_values = nn.Parameter(torch.randn(size, head_dim) * 0.02)

    def _index(self, lq: int, lk: int, query_offset: int, device: torch.device) -> Tensor:
        i = torch.arange(lq, device=device)[:, None] + query_offset
        rel = (torch.arange(lk, device=device)[None, :] - i).clamp(-self.max_distance, self.max_distance)
        if self.causal:  # future pairs are masked; any valid row will do
            return rel.clamp(max=0) + self.max_distance
        return rel + self.max_distance

    def score_bias(self, q: Tensor, num_keys: int, *, query_offset: int = 0) -> Tensor:
        """The term this encoding adds to the scaled scores q·k/√D: q_i·a^K_{clip(j−i)}/√D.

        Args:
            q: (B, Lq, H, D) queries at positions query_offset … query_offset + Lq − 1.
            num_keys: Lk, keys at positions 0 … Lk − 1.
            query_offset: position of the first query.

        Returns:
            (B, H, Lq, Lk); entries for future keys (causal) are meaningless (callers mask).
        """
        idx = self._index(q.shape[1], num_keys, query_offset, q.device)  # (Lq, Lk) rows of rel_keys
        per_row = torch.einsum("bmhd,rd->bhmr", q, self.rel_keys.to(q))
        return per_row.gather(3, idx.expand(*per_row.shape[:2], *idx.shape)) / q.shape[-1] ** 0.5

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, query_offset: int = 0,
               key_padding_mask: Tensor | None = None) -> Tensor:
        """Softmax attention with the relative terms.

        Args:
            q: (B, Lq, H, D) queries at positions query_offset … query_offset + Lq − 1.
            k: (B, Lk, H, D) keys at positions 0 … Lk − 1.
            v: (B, Lk, H, D) values.
            query_offset: position of the first query (decoding: Lq = 1, offset t).
            key_padding_mask: (B, Lk) bool, True at padding keys (no weight).

        Returns:
            (B, Lq, H, D).
        """
        idx = self._index(q.shape[1], k.shape[1], query_offset, q.device)
        return shaw_attention(q, k, v, self.rel_keys[idx], self.rel_values[idx], causal=self.causal,
                              query_offset=query_offset, key_padding_mask=key_padding_mask)

    def extra_repr(self) -> str:
        return f"max_distance={self.max_distance}, causal={self.causal}"


@dataclass(kw_only=True)
class RelativeDistanceOptions:
    """The options of relative encodings with a table of distances (``shaw``, ``music-relative``).

    Attributes:
        max_distance: k, the clipping distance: relative positions |j − i| ≤ k have their own
            embedding, farther ones share the last.
    """

    max_distance: int = option(256, "clipping distance (shaw) / learned distances (music-relative)",
                               flag_type=int)

    def check_options(self) -> None:
        """Raises ValueError if ``max_distance`` is not a positive integer."""
        require_positive(type(self).__name__, max_distance=self.max_distance)


SPEC = PositionalSpec("shaw", "scores", source="Shaw et al. 2018, O(L²D) memory", pair_bytes=8.5,
                      layer_module=lambda c, causal: ShawRelativePosition(head_dim(c), c.max_distance, causal=causal),
                      options=(RelativeDistanceOptions,))

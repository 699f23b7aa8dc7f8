"""ALiBi: attention with linear biases (Press, Smith and Lewis, ICLR 2022).

Letters: B = batch, L = length, H = num_heads, D = head_dim.

Head h adds −m_h·|i − j| to its scores; the slopes m_h form a geometric sequence starting
at 2^(−8/H) (for H not a power of two, the paper's interleaving of the next power's slopes).
No parameters. Softmax attention only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spe.encodings.positions import require_positive
from spe.encodings.spec import PositionalSpec, ScoreEncoding

__all__ = ["ALiBi", "alibi_slopes", "SPEC"]


def alibi_slopes(num_heads: int) -> Tensor:
    """(H,) slopes m_h, section 3 of Press et al."""
    def powers(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if num_heads & (num_heads - 1) == 0:
        return torch.tensor(powers(num_heads))
    below = 2 ** math.floor(math.log2(num_heads))
    return torch.tensor(powers(below) + powers(2 * below)[0::2][: num_heads - below])


class ALiBi(ScoreEncoding):
    """Linear distance penalties on the attention scores.

    Args:
        num_heads: H.
        causal: mask the future (the penalty then is m_h·(j − i), j ≤ i).

    Raises:
        ValueError: if ``num_heads`` is not a positive integer.
    """

    def __init__(self, num_heads: int, *, causal: bool = True) -> None:
        super().__init__()
        require_positive("ALiBi", num_heads=num_heads)
        self.causal = causal
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def bias(self, lq: int, lk: int, *, query_offset: int = 0) -> Tensor:
        """(H, Lq, Lk) additive score bias, −inf on masked pairs."""
        i = torch.arange(lq, device=self.slopes.device)[:, None] + query_offset
        rel = (torch.arange(lk, device=self.slopes.device)[None, :] - i).float()
        out = -self.slopes[:, None, None] * rel.abs()
        return out.masked_fill(rel > 0, float("-inf")) if self.causal else out

    def score_bias(self, q: Tensor, num_keys: int, *, query_offset: int = 0) -> Tensor:
        """The term added to the scaled scores, −m_h·|i − j| (−inf on future keys when causal),
        as (B, H, Lq, Lk) like the other score encodings' (it does not depend on q's values)."""
        bias = self.bias(q.shape[1], num_keys, query_offset=query_offset).to(q.device, q.dtype)
        return bias.expand(q.shape[0], *bias.shape)

    def flex_arguments(self, q: Tensor) -> dict:
        """This term for queries q (B, L, H, D) (unused) as keyword arguments of
        :func:`~spe.ops.softmax.flex.flex_softmax_attention` (its slopes and causality), which
        then equals :meth:`attend` at ``query_offset`` 0."""
        return {"distance_slopes": self.slopes, "causal": self.causal}

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, query_offset: int = 0,
               key_padding_mask: Tensor | None = None) -> Tensor:
        """Args: q (B, Lq, H, D) at positions query_offset …; k, v (B, Lk, H, D); key_padding_mask
        (B, Lk) bool, True at padding keys (no weight). Returns (B, Lq, H, D)."""
        bias = self.bias(q.shape[1], k.shape[1], query_offset=query_offset).to(q.dtype)
        if key_padding_mask is not None:
            bias = bias.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))  # (B, H, Lq, Lk)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=bias)
        return out.transpose(1, 2)


SPEC = PositionalSpec("alibi", "scores", source="Press et al. 2022",
                      layer_module=lambda c, causal: ALiBi(c.num_heads, causal=causal))

"""Absolute positional encodings added to token embeddings.

Letters: B = batch, L = length, C = d_model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["SinusoidalPositionalEncoding"]


class SinusoidalPositionalEncoding(nn.Module):
    """Sinusoidal absolute positional encoding of Vaswani et al. (2017), added to tokens.

    Defined for any position (no maximum length); values are computed on the fly.

    Args:
        d_model: C, the embedding size (even).

    Raises:
        ValueError: if ``d_model`` is odd.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        if d_model % 2:
            raise ValueError(f"SinusoidalPositionalEncoding: d_model must be even, got {d_model}")
        inv = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """Adds the encoding.

        Args:
            x: (B, L, C) token embeddings.
            positions: (L,) positions.

        Returns:
            (B, L, C).
        """
        angle = positions.double()[:, None] * self.inv_freq[None]
        pe = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).flatten(-2)
        return x + pe.to(x.dtype)

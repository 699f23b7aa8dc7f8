"""Absolute positional encodings added to token embeddings.

Letters: B = batch, L = length, C = d_model.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

import torch
from torch import Tensor, nn

from spe.encodings.positions import require_positive
from spe.encodings.spec import KeepsFullPrecision, PositionalSpec, option

__all__ = ["LearnedPositionOptions", "LearnedPositionalEmbedding", "SinusoidalPositionalEncoding", "SPECS"]


class SinusoidalPositionalEncoding(KeepsFullPrecision):
    """Sinusoidal absolute positional encoding of Vaswani et al. (2017), added to tokens.

    Defined for any position (no maximum length); values are computed on the fly, the angles in
    float64 from a float64 table of frequencies that a cast of the model to bfloat16 or float16 leaves
    as it is (:class:`~spe.encodings.spec.KeepsFullPrecision`; a bf16 table put a bf16 model's logits
    11 % off float32 at positions 990-999); the encoding is added in the embeddings' dtype.

    Args:
        d_model: C, the embedding size (even).

    Raises:
        ValueError: if ``d_model`` is not a positive even integer.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        require_positive("SinusoidalPositionalEncoding", d_model=d_model)
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


class LearnedPositionalEmbedding(nn.Module):
    """Trainable absolute position embeddings added to tokens (GPT-style; the decoder-only
    music Transformer tutorial).

    Positions must be integers in [0, max_positions): a position beyond that has no
    embedding, and the module raises instead of indexing out of range. Embeddings of
    positions never seen in training stay at their initial values, which is why this encoding
    does not extrapolate.

    Args:
        max_positions: number of embeddings.
        d_model: C.

    Raises:
        ValueError: if a size is not a positive integer.
    """

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        require_positive("LearnedPositionalEmbedding", max_positions=max_positions, d_model=d_model)
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.randn(max_positions, d_model) * 0.02)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """Adds the embedding of each position.

        Args:
            x: (B, L, C) token embeddings.
            positions: (L,) integer positions.

        Returns:
            (B, L, C).

        Raises:
            ValueError: on non-integer positions or positions outside [0, max_positions).
        """
        if positions.is_floating_point():
            raise ValueError("ape-learned needs integer positions")
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= self.max_positions):
            raise ValueError(f"ape-learned has embeddings for positions 0 … {self.max_positions - 1}, got position "
                             f"{int(positions.max()) if int(positions.min()) >= 0 else int(positions.min())}; "
                             "use shorter sequences or a model with a larger max_positions")
        return x + self.weight[positions]


@dataclass(kw_only=True)
class LearnedPositionOptions:
    """The options of encodings with a most position.

    Attributes:
        max_positions: number of ``ape-learned`` embeddings (longer inputs raise ValueError),
            and the default limit of other encodings with one.
    """

    max_positions: int = option(2048, "number of learned position embeddings (ape-learned); the default "
                                "L_max of encodings with one", flag_type=int)

    def check_options(self) -> None:
        """Raises ValueError if ``max_positions`` is not a positive integer."""
        require_positive(type(self).__name__, max_positions=self.max_positions)


SPECS = (
    PositionalSpec("ape", "tokens", source="sinusoidal, Vaswani et al. 2017", scale_embeddings=True,
                   model_module=lambda c: SinusoidalPositionalEncoding(c.d_model)),
    PositionalSpec("ape-learned", "tokens", source="trainable embeddings (GPT-style)",
                   model_module=lambda c: LearnedPositionalEmbedding(c.max_positions, c.d_model),
                   position_limit=lambda c: c.max_positions,
                   limit_text="learned position embeddings (ape-learned: max_positions)",
                   options=(LearnedPositionOptions,)),
)

"""Rotary position embedding (RoPE; Su et al. 2021, "RoFormer", eq. (13)–(16)).

Letters: B = batch, L = length, H = num_heads, E = rotated dimension (even).

Each pair (x_{2i}, x_{2i+1}) of a query or key at position m is rotated by the angle
m·θ_i, θ_i = base^(−2i/E). Then (R_m q)ᵀ(R_n k) = qᵀ R_{n−m} k depends on m − n only.
Softmax attention rotates queries and keys; linear attention rotates the *feature-mapped*
queries and keys in the numerator only and keeps the unrotated, positive features in the
normaliser (RoFormer eq. (19)), so the normaliser stays positive.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch
from torch import Tensor, nn
from spe.encodings.spec import LayerEncoding, PositionalSpec

__all__ = ["RoPEOptions", "RotaryEncoding", "rotate", "SPEC"]


def rotate(x: Tensor, positions: Tensor, *, base: float = 10000.0) -> Tensor:
    """Rotates consecutive pairs of the last dimension by position-dependent angles.

    Args:
        x: (B, L, H, E) queries or keys (or their features), E even.
        positions: (L,) positions, integer or real-valued (angles are computed in float64,
            so positions of 10⁶ keep full float32 precision).
        base: θ_i = base^(−2i/E).

    Returns:
        (B, L, H, E), same dtype as ``x``.

    Raises:
        ValueError: if E is odd or ``positions`` is not (L,).
    """
    e = x.shape[-1]
    if e % 2:
        raise ValueError(f"rotary encoding needs an even dimension, got {e}")
    if positions.shape != (x.shape[1],):
        raise ValueError(f"positions must have shape ({x.shape[1]},), got {tuple(positions.shape)}")
    inv = base ** (-torch.arange(0, e, 2, dtype=torch.float64, device=x.device) / e)
    angle = positions.to(device=x.device, dtype=torch.float64)[:, None] * inv  # (L, E/2)
    cos, sin = (t.to(x.dtype)[None, :, None, :] for t in (angle.cos(), angle.sin()))
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


class RotaryEncoding(LayerEncoding):
    """RoPE as a module (no parameters); see :func:`rotate`.

    As an attention layer's positional module (:class:`~spe.encodings.spec.LayerEncoding`) it
    transforms the kernel's features: softmax's q and k, a linear kernel's φ(q), φ(k) in the
    numerator only (RoFormer eq. 19), the rotated pairs sharing a gate per channel.

    Args:
        base: the frequency base (10,000 in RoFormer).
    """

    layer_attribute = "rotary"
    transforms_features = True
    numerator_only = True
    channel_tie = 2
    label = "rotary encoding"

    def __init__(self, base: float = 10000.0) -> None:
        super().__init__()
        if base <= 1:
            raise ValueError(f"rotary base must exceed 1, got {base}")
        self.base = base

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x: (B, L, H, E), positions: (L,) → (B, L, H, E) rotated."""
        return rotate(x, positions, base=self.base)

    def transform_features(self, features: Tensor, context: Tensor) -> Tensor:
        return self(features, context)

    def check_features(self, feature_dim: int, what: str) -> None:
        if feature_dim % 2:
            raise ValueError(f"rotary encoding needs an even {what}, got {feature_dim}")

    def extra_repr(self) -> str:
        return f"base={self.base:g}"


@dataclass(kw_only=True)
class RoPEOptions:
    """RoPE's options.

    Attributes:
        rope_base: the frequency base b of the angles b^(−2i/E) (10,000 in RoFormer).
    """

    rope_base: float = 10000.0

    def check_options(self) -> None:
        """Raises ValueError if ``rope_base`` is not a number above 1."""
        if isinstance(self.rope_base, bool) or not isinstance(self.rope_base, int | float) or not self.rope_base > 1:
            raise ValueError(f"rope_base must be a number above 1, got {self.rope_base!r}")


SPEC = PositionalSpec("rope", "queries-keys", source="Su et al. 2021", positive_features=True,
                      layer_module=lambda c, causal: RotaryEncoding(c.rope_base), options=(RoPEOptions,))

"""Rotary position embedding (RoPE; Su et al. 2021, "RoFormer", eq. (13)–(16)), in the token index
or in a learned clock (``rope_time``, :class:`LearnedTimeRotary`).

Letters: B = batch, L = length, C = d_model, H = num_heads, E = rotated dimension (even).

Each pair (x_{2i}, x_{2i+1}) of a query or key at position m is rotated by the angle
m·θ_i, θ_i = base^(−2i/E). Then (R_m q)ᵀ(R_n k) = qᵀ R_{n−m} k depends on m − n only.
Softmax attention rotates queries and keys; linear attention rotates the *feature-mapped*
queries and keys in the numerator only and keeps the unrotated, positive features in the
normaliser (RoFormer eq. (19)), so the normaliser stays positive.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch
from torch import Tensor
from spe.encodings.clock import CLOCK_TIMES, LearnedClock
from spe.encodings.spec import LayerEncoding, PositionalSpec, option

__all__ = ["LearnedTimeRotary", "RoPEOptions", "RotaryEncoding", "rotate", "SPEC"]


def rotate(x: Tensor, positions: Tensor, *, base: float = 10000.0) -> Tensor:
    """Rotates consecutive pairs of the last dimension by position-dependent angles.

    Args:
        x: (B, L, H, E) queries or keys (or their features), E even.
        positions: (L,) positions, integer or real-valued (angles are computed in float64,
            so positions of 10⁶ keep full float32 precision), or (B, L, H) times of each
            sequence and head (a learned clock, :mod:`spe.encodings.clock`; gradients flow into them).
        base: θ_i = base^(−2i/E).

    Returns:
        (B, L, H, E), same dtype as ``x``.

    Raises:
        ValueError: if E is odd or ``positions`` is neither (L,) nor (B, L, H).
    """
    e = x.shape[-1]
    if e % 2:
        raise ValueError(f"rotary encoding needs an even dimension, got {e}")
    if positions.shape not in ((x.shape[1],), x.shape[:3]):
        raise ValueError(f"positions must have shape ({x.shape[1]},) or (batch, length, num_heads) = "
                         f"{tuple(x.shape[:3])}, got {tuple(positions.shape)}")
    inv = base ** (-torch.arange(0, e, 2, dtype=torch.float64, device=x.device) / e)
    angle = positions.to(device=x.device, dtype=torch.float64)[..., None] * inv  # (L, E/2) or (B, L, H, E/2)
    cos, sin = (t.to(x.dtype) for t in (angle.cos(), angle.sin()))
    if positions.dim() == 1:
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
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


class LearnedTimeRotary(RotaryEncoding):
    """RoPE in learned time: angles θ_i·τ_m at each head's clock τ_m = Σ_{0<t≤m} Δ_t, Δ_t =
    softplus(w_hᵀ x_t + b_h) (:class:`~spe.encodings.clock.LearnedClock`), instead of θ_i·m.

    The rotated product (R_{τ_m} q)ᵀ(R_{τ_n} k) depends on τ_m − τ_n only: RoPE, relative in a
    learned time (Mamba-3's data-dependent rotary phases in their simplest form, Lahoti et al.
    2026), the deterministic twin of :class:`~spe.encodings.sine.LearnedTimeSPEFilter`. It
    starts as index RoPE (τ_m = m). The angles are per sequence and head, (B, L, H, E/2) in
    float64 (index RoPE's are (L, E/2)); the clock adds C·H per position. Causal; decoding
    carries τ of the last position (B, H) in the layer's
    :class:`~spe.encodings.spec.EncodingState`.

    Args:
        d_model: C, the size of the layer's input the clock reads.
        num_heads: H.
        base: the frequency base (10,000 in RoFormer).
    """

    stateful = True

    def __init__(self, d_model: int, num_heads: int, base: float = 10000.0) -> None:
        super().__init__(base)
        self.clock = LearnedClock(d_model, num_heads)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (B, L, H, E) rotated by the clock's times ``positions`` (B, L, H) (:meth:`prepare`'s).

        Raises:
            ValueError: for positions that are not (B, L, H) times: (L,) positions would rotate by
                the token index, silently, and train nothing of the clock.
        """
        if positions.shape != x.shape[:3]:
            raise ValueError(f"LearnedTimeRotary rotates by its clock's times (batch, length, num_heads) = "
                             f"{tuple(x.shape[:3])}, got positions {tuple(positions.shape)}: call times, state = "
                             f"rot.prepare(x, None) with x (batch, length, d_model) the layer's input, then "
                             f"rot(features, times), as spe.MultiHeadAttention does")
        return rotate(x, positions, base=self.base)

    def prepare(self, x: Tensor, positions: Tensor | None, state: Tensor | None = None, *,
                key_padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The clock's times τ (B, L, H) of x (B, L, C) going on from ``state`` (B, H) (None: the
        start), and τ of the last position; ``positions`` are not read (the clock replaces them)."""
        return self.clock(x, state, key_padding_mask=key_padding_mask)


@dataclass(kw_only=True)
class RoPEOptions:
    """RoPE's options.

    Attributes:
        rope_base: the frequency base b of the angles b^(−2i/E) (10,000 in RoFormer).
        rope_time: the time the angles read: ``index`` (the token index) or ``learned`` (a
            clock per head from each layer's input, :class:`LearnedTimeRotary`).
    """

    rope_base: float = 10000.0
    rope_time: str = option("index", "the time rope's angles read: index (default) or learned (a clock "
                            "τ_m = Σ Δ_t, Δ_t = softplus(wᵀx_t + b) per head, from each layer's input)",
                            flag_type=str, choices=CLOCK_TIMES)

    def check_options(self) -> None:
        """Raises ValueError if ``rope_base`` is not a number above 1 or ``rope_time`` is unknown."""
        if isinstance(self.rope_base, bool) or not isinstance(self.rope_base, int | float) or not self.rope_base > 1:
            raise ValueError(f"rope_base must be a number above 1, got {self.rope_base!r}")
        if self.rope_time not in CLOCK_TIMES:
            raise ValueError(f"rope_time must be one of {', '.join(CLOCK_TIMES)}, got {self.rope_time!r}")


def build_rotary(config, causal: bool) -> RotaryEncoding:
    """The per-layer rotation of a config: index RoPE, or in learned time (``rope_time``)."""
    if getattr(config, "rope_time", "index") == "index":
        return RotaryEncoding(config.rope_base)
    return LearnedTimeRotary(config.d_model, config.num_heads, config.rope_base)


SPEC = PositionalSpec("rope", "queries-keys", source="Su et al. 2021", positive_features=True,
                      layer_module=build_rotary, options=(RoPEOptions,))

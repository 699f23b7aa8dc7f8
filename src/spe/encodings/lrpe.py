"""LRPE, cosine form (Qin et al. 2023, "Linearized Relative Positional Encoding", TMLR).

Letters: B = batch, L = length, H = num_heads, M = the kernel's feature dimension.

A transform of the kernel's features φ (after the feature map, before the sums): each
feature d of head h gets an angle θ_hd, and at position m

    φ(x_m) → [φ(x_m) ⊙ cos(m θ), φ(x_m) ⊙ sin(m θ)]          (B, L, H, 2M)

so that the product of a transformed query at m and key at n is

    Σ_d φ(q_m)_d φ(k_n)_d cos((m − n) θ_d),

a function of the lag m − n only (cos a cos b + sin a sin b = cos(a − b); unlike RoPE on
features there are no sine cross terms between features). The product can be negative, so
with linear attention only the numerator is transformed and the normaliser keeps the
untransformed, strictly positive features (as RoPE does, RoFormer eq. 19): ReLU features are
refused, as for ``rope``.

Angles: ``fixed`` θ_d = base^(−d/M), d = 0 … M − 1 (the range of RoPE's angles, one per
feature), or ``learned`` (a parameter per head and feature, initialised there). The phases
m·θ are formed in float64 (float32 loses ~1e-3 rad at m ≈ 10⁴), as RoPE does.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch
from torch import Tensor, nn

from spe.encodings.positions import require_positive
from spe.encodings.spec import FeatureEncoding, KeepsFullPrecision, PositionalSpec, option

__all__ = ["LRPE", "LRPEOptions", "LRPE_ANGLES", "lrpe_angles", "lrpe_features", "lrpe_weights_reference", "SPEC"]

LRPE_ANGLES = ("fixed", "learned")


def lrpe_angles(feature_dim: int, *, base: float = 10000.0) -> Tensor:
    """θ_d = base^(−d/M), d = 0 … M − 1: (M,) float64 radians per position."""
    return base ** (-torch.arange(feature_dim, dtype=torch.float64) / feature_dim)


def lrpe_features(x: Tensor, positions: Tensor, angles: Tensor) -> Tensor:
    """[x ⊙ cos(mθ), x ⊙ sin(mθ)] on the last dimension.

    Args:
        x: (B, L, H, M) features φ(q) or φ(k).
        positions: (L,) positions, integer or real.
        angles: (M,) or (H, M) θ in radians per position (a parameter keeps its gradient:
            the phases are formed from it in float64).

    Returns:
        (B, L, H, 2M) in ``x``'s dtype.

    Raises:
        ValueError: if ``positions`` is not (L,) or ``angles`` does not end in M.
    """
    if positions.shape != (x.shape[1],):
        raise ValueError(f"positions must have shape ({x.shape[1]},), got {tuple(positions.shape)}")
    if angles.shape[-1] != x.shape[-1] or (angles.dim() == 2 and angles.shape[0] != x.shape[2]):
        raise ValueError(f"LRPE angles of shape {tuple(angles.shape)} do not fit features (B, L, H, M) = "
                         f"{tuple(x.shape)}")
    theta = angles.to(device=x.device, dtype=torch.float64).expand(x.shape[2], -1)  # (H, M)
    phase = positions.to(device=x.device, dtype=torch.float64)[:, None, None] * theta  # (L, H, M)
    cos, sin = (t.to(x.dtype)[None] for t in (phase.cos(), phase.sin()))  # (1, L, H, M)
    return torch.cat([x * cos, x * sin], dim=-1)


def lrpe_weights_reference(phi_q: Tensor, phi_k: Tensor, positions: Tensor, angles: Tensor) -> tuple[Tensor, Tensor]:
    """The slow twin of :func:`lrpe_features` in linear attention: explicit O(L²) weights, float64.

    Args:
        phi_q, phi_k: (B, L, H, M) untransformed features (keys with any scale applied).
        positions: (L,).
        angles: (M,) or (H, M).

    Returns:
        numerator weights Σ_d φ(q_m)_d φ(k_n)_d cos((m − n) θ_d) and normaliser weights
        Σ_d φ(q_m)_d φ(k_n)_d, each (B, H, L, L) (query m, key n), unmasked.
    """
    theta = angles.double().expand(phi_q.shape[2], -1)  # (H, M)
    pos = positions.double()
    lag = pos[:, None] - pos[None, :]  # (L, L)
    cos = torch.cos(lag[None, :, :, None] * theta[:, None, None, :])  # (H, L, L, M)
    fq, fk = phi_q.double(), phi_k.double()
    num = torch.einsum("bmhd,bnhd,hmnd->bhmn", fq, fk, cos)
    return num, torch.einsum("bmhd,bnhd->bhmn", fq, fk)


class LRPE(KeepsFullPrecision, FeatureEncoding):
    """The cosine LRPE as a feature transform of :class:`~spe.attention.MultiHeadAttention`.

    Args:
        num_heads: H.
        feature_dim: M, the kernel's feature dimension (``num_features`` for performer,
            head_dim for the elementwise kernels); the output has 2M.
        angles: ``fixed`` (no parameter, nothing in the state dict) or ``learned`` (an (H, M)
            parameter ``angles``, initialised at the fixed values, not weight-decayed).
        base: the fixed spacing's base.

    Learned angles stay float32 when a model is cast to bfloat16 or float16
    (:class:`~spe.encodings.spec.KeepsFullPrecision`): they are multiplied by positions.

    Raises:
        ValueError: on an unknown ``angles``, a size that is not a positive integer or a base ≤ 1.
    """

    numerator_only = True  # the product may be negative: the normaliser keeps positive features
    label = "LRPE"

    def __init__(self, num_heads: int, feature_dim: int, *, angles: str = "fixed", base: float = 10000.0) -> None:
        super().__init__()
        if angles not in LRPE_ANGLES:
            raise ValueError(f"lrpe_angles must be one of {', '.join(LRPE_ANGLES)}, got {angles!r}")
        require_positive("LRPE", num_heads=num_heads, feature_dim=feature_dim)
        if base <= 1:
            raise ValueError(f"LRPE base must exceed 1, got {base}")
        self.num_heads, self.feature_dim, self.mode, self.base = num_heads, feature_dim, angles, base
        if angles == "learned":
            self.angles = nn.Parameter(lrpe_angles(feature_dim, base=base).float().repeat(num_heads, 1))

    def current_angles(self) -> Tensor:
        """θ: (H, M) learned or (M,) fixed, radians per position."""
        return self.angles if self.mode == "learned" else lrpe_angles(self.feature_dim, base=self.base)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x: (B, L, H, M), positions: (L,) → (B, L, H, 2M)."""
        return lrpe_features(x, positions, self.current_angles())

    def weights_reference(self, phi_q: Tensor, phi_k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(numerator, normaliser) weights (B, H, L, L), :func:`lrpe_weights_reference`."""
        return lrpe_weights_reference(phi_q, phi_k, positions, self.current_angles())

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, feature_dim={self.feature_dim}, angles={self.mode}, base={self.base:g}"


@dataclass(kw_only=True)
class LRPEOptions:
    """LRPE's options.

    Attributes:
        lrpe_angles: the angles θ_d: ``fixed`` at base^(−d/M) (10,000, no parameter) or
            ``learned`` (an (H, M) parameter per layer, initialised there).
    """

    lrpe_angles: str = option("fixed", "lrpe angles (default fixed)", flag_type=str, choices=LRPE_ANGLES)

    def check_options(self) -> None:
        """Raises ValueError on an unknown ``lrpe_angles``."""
        if self.lrpe_angles not in LRPE_ANGLES:
            raise ValueError(f"lrpe_angles must be one of {', '.join(LRPE_ANGLES)}, got {self.lrpe_angles!r}")


SPEC = PositionalSpec("lrpe", "features", source="Qin et al. 2023 (TMLR), cosine form", positive_features=True,
                      layer_module=lambda c, causal: LRPE(c.num_heads, c.feature_dim, angles=c.lrpe_angles),
                      options=(LRPEOptions,))

"""cosFormer's cos-based re-weighting (Qin et al. 2022, ICLR, eq. 9-11).

Letters: B = batch, L = length, H = num_heads, M = the kernel's feature dimension.

The attention weight of query m on key n is φ(q_m)·φ(k_n) · cos(π/2 · (m − n)/L_max), formed
in linear time from the decomposition cos(a − b) = cos a cos b + sin a sin b:

    φ(x_m) → [φ(x_m) cos(πm / 2L_max), φ(x_m) sin(πm / 2L_max)]          (B, L, H, 2M)

in the numerator and the normaliser alike. With non-negative features (ReLU in the paper;
elu + 1 and FAVOR+ are non-negative too, so every linear kernel takes it) each weight is
non-negative as long as |m − n| ≤ L_max, where the cosine reaches 0.

**cosFormer cannot attend beyond L_max**: past it the cosine turns negative and the weights
are no longer a distribution (at |m − n| = 2 L_max they are −φ(q)·φ(k)). Positions must
therefore lie in [0, L_max), which keeps every lag below L_max; a position outside raises
ValueError instead of silently giving negative weights. This is also why cosFormer does not
extrapolate: the re-weighting is tied to the L_max it was trained with, and a larger L_max at
test time changes every weight.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

import torch
from torch import Tensor, nn

from spe.encodings.positions import require_positive
from spe.encodings.absolute import LearnedPositionOptions
from spe.encodings.spec import FeatureEncoding, PositionalSpec, option

__all__ = ["CosFormerOptions", "CosFormerReweighting", "cosformer_features", "cosformer_weights_reference", "SPEC"]


def cosformer_features(x: Tensor, positions: Tensor, max_length: int) -> Tensor:
    """[x cos(πm / 2L_max), x sin(πm / 2L_max)] on the last dimension.

    Args:
        x: (B, L, H, M) features φ(q) or φ(k).
        positions: (L,) positions in [0, L_max), integer or real.
        max_length: L_max.

    Returns:
        (B, L, H, 2M) in ``x``'s dtype (phases formed in float64).

    Raises:
        ValueError: if ``positions`` is not (L,), or a position lies outside [0, L_max).
    """
    if positions.shape != (x.shape[1],):
        raise ValueError(f"positions must have shape ({x.shape[1]},), got {tuple(positions.shape)}")
    pos = positions.to(device=x.device, dtype=torch.float64)
    outside = (pos < 0) | (pos >= max_length)
    if bool(outside.any()):
        raise ValueError(f"cosFormer attends within L_max = {max_length} positions (0 … {max_length - 1}), got "
                         f"position {pos[outside][0].item():g}: beyond L_max its cos re-weighting turns negative; "
                         "build the model with a larger cosformer_max_length (default: max_positions)")
    phase = (math.pi / (2 * max_length)) * pos
    cos, sin = (t.to(x.dtype)[None, :, None, None] for t in (phase.cos(), phase.sin()))
    return torch.cat([x * cos, x * sin], dim=-1)


def cosformer_weights_reference(phi_q: Tensor, phi_k: Tensor, positions: Tensor,
                                max_length: int) -> tuple[Tensor, Tensor]:
    """The slow twin of :func:`cosformer_features` in linear attention: explicit O(L²)
    weights φ(q_m)·φ(k_n) cos(π/2 · (m − n)/L_max), float64, (B, H, L, L) (query m, key n),
    unmasked, twice (the normaliser's are the same)."""
    pos = positions.double()
    cos = torch.cos(math.pi / 2 * (pos[:, None] - pos[None, :]) / max_length)  # (L, L)
    weights = torch.einsum("bmhd,bnhd->bhmn", phi_q.double(), phi_k.double()) * cos
    return weights, weights


class CosFormerReweighting(FeatureEncoding):
    """cosFormer's re-weighting as a feature transform of :class:`~spe.attention.MultiHeadAttention`
    (no parameters, nothing in the state dict).

    Args:
        max_length: L_max; positions must lie in [0, L_max) (see the module docstring).

    Raises:
        ValueError: if ``max_length`` is not a positive integer.
    """

    numerator_only = False  # weights are non-negative within L_max: normaliser re-weighted alike
    label = "cosFormer"

    def __init__(self, max_length: int) -> None:
        super().__init__()
        require_positive("CosFormerReweighting", max_length=max_length)
        self.max_length = max_length

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x: (B, L, H, M), positions: (L,) in [0, L_max) → (B, L, H, 2M)."""
        return cosformer_features(x, positions, self.max_length)

    def weights_reference(self, phi_q: Tensor, phi_k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(numerator, normaliser) weights (B, H, L, L), :func:`cosformer_weights_reference`."""
        return cosformer_weights_reference(phi_q, phi_k, positions, self.max_length)

    def extra_repr(self) -> str:
        return f"max_length={self.max_length}"


@dataclass(kw_only=True)
class CosFormerOptions:
    """cosFormer's options (with ``max_positions``, its default L_max).

    Attributes:
        cosformer_max_length: L_max; the encoding attends only within L_max positions (a
            position ≥ L_max raises ValueError); None: ``max_positions``.
    """

    cosformer_max_length: int | None = option(None, "cosformer's L_max: it attends within L_max positions only "
                                              "(default: max positions)", flag_type=int)

    def check_options(self) -> None:
        """Raises ValueError if L_max is given and not a positive integer."""
        if self.cosformer_max_length is not None:
            require_positive(type(self).__name__, cosformer_max_length=self.cosformer_max_length)
            self.cosformer_max_length = int(self.cosformer_max_length)


def _max_length(config) -> int:
    # L_max: cosformer_max_length, else the model's max_positions
    return config.max_positions if config.cosformer_max_length is None else config.cosformer_max_length


SPEC = PositionalSpec("cosformer", "features", source="Qin et al. 2022 (ICLR), attends within L_max only",
                      layer_module=lambda c, causal: CosFormerReweighting(_max_length(c)),
                      position_limit=_max_length,
                      limit_text="positions cosFormer attends within (L_max: cosformer_max_length, "
                                 "default max_positions)",
                      options=(LearnedPositionOptions, CosFormerOptions))

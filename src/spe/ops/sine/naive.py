"""The slow, obviously correct twin of the blocked sineSPE products: Ω formed whole, one einsum.

Letters: B = batch, L = length, H = num_heads, D = head_dim, K = num_sines (J = 2K cos/sin
columns), R = num_realizations. Tests compare :class:`~spe.ops.sine.fused.FusedSineProduct` and
:class:`~spe.ops.sine.blocked.SharedSineProduct` to it, forward and backward (in float64 too).
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.sine.phases import sine_features

__all__ = ["sine_product_reference"]


def sine_product_reference(x: Tensor, freqs: Tensor, phases: Tensor | None, positions: Tensor, w: Tensor) -> Tensor:
    """y[b, l, h, r] = Σ_{d, j} x[b, l, h, d] Ω[l, h, d, j] W[h, d, j, r], Ω formed whole.

    Args:
        x: (B, L, H, D).
        freqs: (H, D, K) f, cycles per position.
        phases: (H, D, K) θ, or None.
        positions: (L,).
        w: (H, D, 2K, R) (the fused product takes it as (H, D·2K, R)).

    Returns:
        (B, L, H, R). Memory O(L·H·D·2K) for Ω, plus autograd's copies: for tests.
    """
    omega = sine_features(freqs, positions, phases).to(x.dtype)  # (L, H, D, 2K)
    return torch.einsum("blhd,lhdj,hdjr->blhr", x, omega, w)

"""The slow, obviously correct twin of :func:`spe.ops.conv.conv_code_product`: whole codes
formed by an explicit sum over the filter taps, then applied with one einsum (for tests).

Letters: B = batch, L = length, H = num_heads, D = head_dim, R = num_realizations, P = kernel_size.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["conv_code_product_reference"]


def conv_code_product_reference(x: Tensor, z: Tensor, filters: Tensor) -> Tensor:
    """y[b, t, h, r] = Σ_d x[b, t, h, d] Σ_p Φ[h, d, p] Z[h, d, r, t + P − 1 − p].

    Args:
        x: (B, L, H, D) queries or keys (already scaled).
        z: (H, D, R, L + P − 1) noise, time last; code position t reads noise samples
            t … t + P − 1 (the span starts P − 1 samples before the first position).
        filters: (H, D, P) Φ.

    Returns:
        (B, L, H, R). Memory O(L·P·H·D·R): for tests.
    """
    p = filters.shape[-1]
    length = z.shape[-1] - p + 1
    # windows[h, d, r, t, i] = z[h, d, r, t + i]; tap p reads i = P − 1 − p
    windows = z.unfold(-1, p, 1)[..., :length, :].flip(-1)  # (H, D, R, L, P)
    code = torch.einsum("hdrtp,hdp->thdr", windows, filters)
    return torch.einsum("bthd,thdr->bthr", x, code)

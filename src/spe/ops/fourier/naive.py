"""Float64 O(L²) references of Fourier mixing: the DFT matrices written out.

Letters: B = batch, L = length, C = channels, N = the causal form's DFT length.

    u = F_C x (each position's channels),  y_m = Re(s Σ_n w^{m n} u_n),  w = exp(−2πi / N)

FNet (non-causal): n over the whole sequence, N = L (each sequence's real length with a
padding mask); the causal twin: n ≤ m, a fixed N. The exponents m·n are reduced mod N in
integers before the cosine and sine, so the matrices are exact to float64 rounding at any length.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["naive_fourier_mixing"]


def _dft_matrix(rows: Tensor, cols: Tensor, n: int) -> Tensor:
    """(len(rows), len(cols)) complex128 w^{r c}, w = exp(−2πi / n)."""
    angle = torch.remainder(rows[:, None] * cols[None, :], n).double() * (-2 * math.pi / n)
    return torch.complex(torch.cos(angle), torch.sin(angle))


def naive_fourier_mixing(x: Tensor, *, causal: bool = False, length: int | None = None, norm: str = "backward",
                         key_padding_mask: Tensor | None = None) -> Tensor:
    """The reference of :func:`spe.ops.fourier.fourier_mixing` (same arguments), in float64.

    Returns:
        (B, L, C) float64.
    """
    b, n_pos, c = x.shape
    ortho = norm == "ortho"
    ch = torch.arange(c)
    u = x.double().to(torch.complex128) @ _dft_matrix(ch, ch, c).T  # (B, L, C)
    if ortho:
        u = u / math.sqrt(c)
    pos = torch.arange(n_pos)
    if causal:
        w = _dft_matrix(pos, pos, length) * torch.ones(n_pos, n_pos).tril()
        return (w @ u).real / (math.sqrt(length) if ortho else 1.0)
    lengths = [n_pos] * b if key_padding_mask is None else (~key_padding_mask).sum(1).tolist()
    y = torch.zeros(b, n_pos, c, dtype=torch.float64)
    for i, n in enumerate(lengths):
        if n:
            w = _dft_matrix(pos[:n], pos[:n], n)
            y[i, :n] = (w @ u[i, :n]).real / (math.sqrt(n) if ortho else 1.0)
    return y

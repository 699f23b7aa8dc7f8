"""Filtering noise into convSPE codes: Σ_p Φ(p) Z(t − p), by real FFT or by direct convolution.

Letters: H = num_heads, D = head_dim, R = num_realizations, P = kernel_size, T = L + P − 1
samples of noise for L code positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["direct_filter", "fft_filter", "fft_size", "time_first"]


def fft_size(n: int) -> int:
    """The smallest 5-smooth integer ≥ n (2^a 3^b 5^c: lengths the real FFT handles fastest)."""
    best = 1 << max(0, (n - 1).bit_length())
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35 * (1 << max(0, (-(-n // p35) - 1).bit_length()))
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def fft_filter(z: Tensor, filters: list[Tensor]) -> list[Tensor]:
    """Σ_p Φ(p) Z(t − p) for t ∈ [P − 1, T) by real FFTs, one noise spectrum for every filter.

    Args:
        z: (H, D, R, T) noise, time last.
        filters: (H, D, P) each.

    Returns:
        One contiguous (T − P + 1, H, D, R) code per filter. Zero-padding to ``fft_size(T)`` ≥ T
        makes the circular convolution linear on the kept outputs. The transforms run on
        time-last signals: along a strided axis, or after a transposing copy, the same work is
        3-4× slower on CPU.
    """
    # contiguous (L, H, D, R): every layer's code product then reads it as it is, where a
    # time-last view made each layer copy (and save for backward) its own transposed code
    t, p = z.shape[-1], filters[0].shape[-1]
    n = fft_size(t)
    zf = torch.fft.rfft(z, n=n)  # (H, D, R, F), shared by Q̄ and K̄
    return [time_first(torch.fft.irfft(zf * torch.fft.rfft(f, n=n)[:, :, None], n=n), p - 1, t - p + 1)
            for f in filters]


def time_first(signal: Tensor, start: int, count: int) -> Tensor:
    """Samples start … start + count − 1 of a time-last (H, D, R, n) signal, time first:
    a contiguous (count, H, D, R).

    The whole (H·D·R, n) matrix is transposed, then the kept rows sliced: PyTorch's blocked
    2-D transpose copy applies only to an exact transposed view (a 4-D permute of the sliced
    view was measured 4× slower)."""
    h, d, r, n = signal.shape
    return signal.reshape(h * d * r, n).t().contiguous()[start:start + count].view(count, h, d, r)


def direct_filter(z: Tensor, filters: list[Tensor]) -> list[Tensor]:
    """The direct twin of :func:`fft_filter` (``conv1d``, O(L·P) per feature and realisation);
    same arguments and returns."""
    h, d, r, t = z.shape
    p = filters[0].shape[-1]
    x = z.permute(2, 0, 1, 3).reshape(r, h * d, t)  # (R, H·D, L + P − 1)
    # conv1d is a cross-correlation: flipping the filters gives Σ_p Φ(p) Z(t − p).
    weight = torch.stack(filters, dim=2).reshape(h * d * len(filters), 1, p).flip(-1)
    y = F.conv1d(x, weight, groups=h * d)  # (R, H·D·c, L)
    y = y.view(r, h, d, len(filters), -1).permute(3, 4, 1, 2, 0)  # (c, L, H, D, R)
    return [code.contiguous() for code in y]

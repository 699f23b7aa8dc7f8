"""Filtering noise into convSPE codes: Σ_p Φ(p) Z(t − p), by real FFT or by direct convolution.

Letters: H = num_heads, D = head_dim, R = num_realizations, P = kernel_size, T = L + P − 1
samples of noise for L code positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["BLOCK_ELEMENTS", "add_filter_grad", "block_length", "direct_filter", "fft_filter", "fft_size",
           "filter_grad", "filter_spectrum", "new_filter_spectrum", "span_code", "time_first"]


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


# Elements of one block's code (l·H·D·R) in the blocked FFTs: spans of 512 samples at the main
# job's sizes (H·D·R = 8,192), measured the fastest of 2^21-2^24 (one thread, L = 4,096; larger
# blocks fall out of the caches).
BLOCK_ELEMENTS = 1 << 22


def block_length(target: int, kernel_size: int, length: int | None = None) -> int:
    """The number of positions l of a block whose noise span N = l + P − 1 is a power of two.

    N is the largest power of two with l ≤ ``target``, but at least 4P (so that the P − 1
    samples of overlap stay under a quarter of each span) and no more than the smallest
    power of two that covers ``length`` positions in one block. (Power-of-two transforms were
    measured 1.7× faster per sample than 5-smooth ones near 2,000.)
    """
    p = kernel_size
    n = 1 << max(0, (max(1, target) + p - 1).bit_length() - 1)  # largest power of two ≤ target + P − 1
    n = max(n, 1 << (4 * p - 1).bit_length())
    if length is not None:
        n = min(n, 1 << (length + p - 2).bit_length())
    return n - p + 1


def filter_spectrum(f: Tensor, n: int) -> Tensor:
    """Φ̂ (H, D, 1, n // 2 + 1) of (H, D, P) filters at FFT size n, broadcast over R."""
    return torch.fft.rfft(f, n=n)[:, :, None]


def span_code(zf: Tensor, spectrum: Tensor, n: int, p: int, l: int) -> Tensor:
    """The (l, H, D, R) code of one noise span from its spectrum Ẑ (H, D, R, n // 2 + 1) and a
    filter's: samples P − 1 … P − 2 + l of the circular convolution, where it is linear."""
    return time_first(torch.fft.irfft(zf * spectrum, n=n), p - 1, l)


def add_filter_grad(spec: Tensor, zf: Tensor, code_grad: Tensor, n: int) -> None:
    """Adds Σ_r Ĝ_r conj(Ẑ_r) to ``spec`` (H, D, n // 2 + 1): one span's share of a filter's
    gradient, G the gradient (l, H, D, R) of the span's code (:func:`filter_grad` ends it)."""
    l, h, d, r = code_grad.shape
    time_last = code_grad.reshape(l, h * d * r).t().contiguous()  # a fast 2-D transpose
    spec += torch.linalg.vecdot(zf, torch.fft.rfft(time_last.to(zf.real.dtype), n=n).view(h, d, r, -1), dim=2)


def filter_grad(spec: Tensor, n: int, p: int) -> Tensor:
    """∂/∂Φ[h, d, p] = Σ_{t, r} G[t, h, d, r] Z[h, d, r, t + P − 1 − p] (H, D, P) from the spans'
    summed :func:`add_filter_grad`: G enters the correlation shifted by P − 1 samples, one
    phase per frequency, and nothing wraps around (t + P − 1 − p stays within each span)."""
    freq = torch.arange(n // 2 + 1, device=spec.device, dtype=spec.real.dtype)
    return torch.fft.irfft(spec * torch.exp(-2j * torch.pi * (p - 1) / n * freq), n=n)[..., :p]


def new_filter_spectrum(f: Tensor, n: int) -> Tensor:
    """Zeros for :func:`add_filter_grad` to sum into, for (H, D, P) filters at FFT size n."""
    return f.new_zeros(*f.shape[:2], n // 2 + 1, dtype=(torch.ones(1, dtype=f.dtype) * 1j).dtype)


class _FFTFilter(torch.autograd.Function):
    """The codes of every filter, span by span; backward sums the filters' gradients over the
    spans in the frequency domain (the codes' spectra are not kept)."""

    @staticmethod
    def forward(ctx, z: Tensor, block: int, *filters: Tensor) -> tuple[Tensor, ...]:
        h, d, r, t = z.shape
        p = filters[0].shape[-1]
        n, length = block + p - 1, t - p + 1
        codes = [z.new_empty(length, h, d, r) for _ in filters]
        spectra = [filter_spectrum(f, n) for f in filters]
        for s in range(0, length, block):
            e = min(length, s + block)
            zf = torch.fft.rfft(z[..., s:e + p - 1], n=n)  # shared by every filter
            for code, spectrum in zip(codes, spectra):
                code[s:e] = span_code(zf, spectrum, n, p, e - s)
        ctx.save_for_backward(z, *filters)
        ctx.block = block
        ctx.set_materialize_grads(False)  # an unused code's gradient stays None: no spans transformed for it
        return tuple(codes)

    @staticmethod
    def backward(ctx, *grads: Tensor):
        z, *filters = ctx.saved_tensors
        p, block = filters[0].shape[-1], ctx.block
        n, length = block + p - 1, z.shape[-1] - p + 1
        wanted = [i for i, g in enumerate(grads) if g is not None and ctx.needs_input_grad[2 + i]]
        specs = {i: new_filter_spectrum(filters[i], n) for i in wanted}
        for s in range(0, length, block):
            e = min(length, s + block)
            zf = torch.fft.rfft(z[..., s:e + p - 1], n=n)
            for i in wanted:
                add_filter_grad(specs[i], zf, grads[i][s:e], n)
        return (None, None, *(filter_grad(specs[i], n, p) if i in specs else None for i in range(len(filters))))


def fft_filter(z: Tensor, filters: list[Tensor]) -> list[Tensor]:
    """Σ_p Φ(p) Z(t − p) for t ∈ [P − 1, T) by real FFTs of spans of the noise (overlap-save),
    one noise spectrum per span for every filter.

    Args:
        z: (H, D, R, T) noise, time last; no gradient flows to it.
        filters: (H, D, P) each.

    Returns:
        One contiguous (T − P + 1, H, D, R) code per filter: every layer's code product then
        reads it as it is (a time-last view made each layer copy, and save for backward, its
        own transposed code). Spans of N = l + P − 1 samples (:func:`block_length`, a power of
        two) give l codes each; each span's codes are turned time-first by one 2-D transpose.
        Backward keeps no spectrum: it transforms the noise again with the codes' gradients.
    """
    h, d, r, t = z.shape
    p = filters[0].shape[-1]
    block = block_length(BLOCK_ELEMENTS // max(1, h * d * r), p, t - p + 1)
    return list(_FFTFilter.apply(z.detach(), block, *filters))


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

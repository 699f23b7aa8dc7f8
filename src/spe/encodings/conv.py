"""convSPE: vanishing relative kernels from filtered noise, eq. (22) and appendix A.1 of Liutkus et al. 2021.

Letters: L = length, H = num_heads, D = head_dim, R = num_realizations, P = kernel_size.

Orientation (causal, so decoding needs only past noise):
    Q̄_d(t) = Σ_{p<P} Φ^Q_d(p) Z_d(t − p),   K̄_d(t) = Σ_{p<P} Φ^K_d(p) Z_d(t − p),
    P_d(τ) = E[Q̄_d(m) K̄_d(n)] / R = Σ_p Φ^Q_d(p) Φ^K_d(p − τ),  zero for |τ| ≥ P.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spe.encodings.code import DenseCode
from spe.encodings.positions import NOISE_DTYPE, require_positive, resolve_positions

__all__ = ["NOISE_BLOCK", "ConvSPE"]

# Noise Z is indexed by absolute time and drawn in blocks of this many positions, each from
# its own seed, so a code for positions [0, N) agrees with the code for [0, N') on their
# common prefix on every device (needed when generation recomputes a growing prefix).
NOISE_BLOCK = 64


@functools.lru_cache(maxsize=4)
def _noise_block(seed: int, shape: tuple[int, ...]) -> Tensor:
    # Recurrent decoding asks for the same one or two blocks at every step: keep the last few.
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=NOISE_DTYPE)


class ConvSPE(nn.Module):
    """Convolutional stochastic positional encoding (convSPE), eq. (22), 1-D.

    Args:
        num_heads: H.
        head_dim: D.
        num_realizations: R, default noise realisations per draw.
        kernel_size: P, filter length in positions; the kernel vanishes for |lag| ≥ P.
        impl: ``fft`` (frequency domain, O(N log N), appendix A.2), ``direct`` (``conv1d``,
            O(N·P)) or ``auto`` (fft when P ≥ 16). Same numbers either way.

    Raises:
        ValueError: if a size is not positive or ``impl`` is unknown.
    """

    def __init__(self, num_heads: int, head_dim: int, num_realizations: int = 64,
                 kernel_size: int = 128, *, impl: str = "auto") -> None:
        super().__init__()
        if impl not in ("auto", "fft", "direct"):
            raise ValueError(f"ConvSPE: impl must be 'auto', 'fft' or 'direct', got {impl!r}")
        self.impl = impl
        require_positive("ConvSPE", num_heads=num_heads, head_dim=head_dim,
                         num_realizations=num_realizations, kernel_size=kernel_size)
        self.num_heads, self.head_dim = num_heads, head_dim
        self.num_realizations, self.kernel_size = num_realizations, kernel_size
        # A decaying envelope of unit norm: P_d(0) = 1 and the kernel decreases with |lag|;
        # a little noise breaks the symmetry between Φ^Q and Φ^K.
        envelope = torch.exp(-torch.arange(kernel_size, dtype=torch.float32) / max(kernel_size / 4, 1))
        envelope = envelope / envelope.norm()
        base = envelope.expand(num_heads, head_dim, kernel_size)
        self.filters_q = nn.Parameter(base + 0.01 * torch.randn(base.shape) / math.sqrt(kernel_size))
        self.filters_k = nn.Parameter(base + 0.01 * torch.randn(base.shape) / math.sqrt(kernel_size))

    def noise(self, times: Tensor, num_realizations: int, seed: int) -> Tensor:
        """Z at integer absolute times ≥ −(P − 1), shape (N, H, D, R), N(0, 1).

        The same (seed, time) always gives the same values, whatever else is asked for.
        """
        idx = times.cpu().long() + (self.kernel_size - 1)
        if idx.numel() and int(idx.min()) < 0:
            raise ValueError(f"ConvSPE: positions must be ≥ 0, got {int(times.min())}")
        shape = (NOISE_BLOCK, self.num_heads, self.head_dim, num_realizations)
        which = idx // NOISE_BLOCK
        z = torch.empty((idx.numel(),) + shape[1:])
        for b in torch.unique(which).tolist():
            rows = (which == b).nonzero().flatten()
            z[rows] = _noise_block(seed * (1 << 21) + b, shape)[idx[rows] % NOISE_BLOCK]
        return z.to(device=self.filters_q.device, dtype=self.filters_q.dtype)

    def forward(
        self,
        length: int | None = None,
        *,
        positions: Tensor | None = None,
        query_positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        num_realizations: int | None = None,
        generator: torch.Generator | None = None,
    ) -> DenseCode:
        """Draws one code Q̄, K̄ of eq. (22).

        Args:
            length: positions 0 … length−1; or ``positions`` (L,), or ``query_positions``
                (Lq,) with ``key_positions`` (Lk,); integer positions ≥ 0.
            num_realizations: R for this draw (default: the constructor's).
            generator: source of randomness (a seed for the noise blocks, and ε).

        Returns:
            A :class:`DenseCode` with qbar (Lq, H, D, R), kbar (Lk, H, D, R), gate_noise (H, D, R).

        Raises:
            ValueError: on missing, inconsistent, negative or non-integer positions.
        """
        pos_q, pos_k = resolve_positions(length, positions, query_positions, key_positions,
                                         device=self.filters_q.device)
        for pos in (pos_q, pos_k):
            if pos.is_floating_point() and not torch.equal(pos, pos.round()):
                raise ValueError("ConvSPE: positions must be integers (use SineSPE for real-valued positions)")
        r = self.num_realizations if num_realizations is None else num_realizations
        require_positive("ConvSPE", num_realizations=r)
        seed = int(torch.randint(0, 1 << 31, (1,), generator=generator))
        eps = torch.randn(self.num_heads, self.head_dim, r, generator=generator, dtype=NOISE_DTYPE)
        eps = eps.to(device=self.filters_q.device, dtype=self.filters_q.dtype)
        if torch.equal(pos_q, pos_k):
            qbar, kbar = self._filter(pos_q.long(), r, seed, both=True)
        else:
            qbar = self._filter(pos_q.long(), r, seed, both=False, filters=self.filters_q)
            kbar = self._filter(pos_k.long(), r, seed, both=False, filters=self.filters_k)
        return DenseCode(qbar=qbar, kbar=kbar, gate_noise=eps)

    def _filter(self, pos: Tensor, r: int, seed: int, *, both: bool,
                filters: Tensor | None = None):
        p, h, d = self.kernel_size, self.num_heads, self.head_dim
        contiguous = pos.numel() > 1 and bool((pos.diff() == 1).all())
        if not contiguous:
            # Arbitrary positions or one decoding step: explicit windows of P past samples.
            times = pos[:, None] - torch.arange(p, device=pos.device)[None]  # (L, P)
            z = self.noise(times.flatten(), r, seed).view(pos.numel(), p, h, d, r)
            apply = lambda f: torch.einsum("lphdr,hdp->lhdr", z, f)
            return (apply(self.filters_q), apply(self.filters_k)) if both else apply(filters)
        start = int(pos[0])
        times = torch.arange(start - p + 1, start + pos.numel())
        z = self.noise(times, r, seed)  # (L + P − 1, H, D, R)
        stacked = [self.filters_q, self.filters_k] if both else [filters]
        if self.impl == "fft" or (self.impl == "auto" and p >= 16):
            # Circular convolution of length L + P − 1: wrap-around only touches the first P − 1
            # outputs, which are dropped.
            t = z.shape[0]
            zf = torch.fft.rfft(z.permute(1, 2, 3, 0), n=t)  # (H, D, R, F)
            ys = [torch.fft.irfft(zf * torch.fft.rfft(f, n=t)[:, :, None], n=t)[..., p - 1:]
                  .permute(3, 0, 1, 2).contiguous() for f in stacked]  # (L, H, D, R)
            return (ys[0], ys[1]) if both else ys[0]
        x = z.permute(3, 1, 2, 0).reshape(r, h * d, -1)  # (R, H·D, L + P − 1)
        # conv1d is a cross-correlation: flipping the filters gives Σ_p Φ(p) Z(t − p).
        weight = torch.stack(stacked, dim=2).reshape(h * d * len(stacked), 1, p).flip(-1)
        y = F.conv1d(x, weight, groups=h * d)  # (R, H·D·c, L)
        y = y.view(r, h, d, len(stacked), -1).permute(3, 4, 1, 2, 0)  # (c, L, H, D, R)
        return (y[0], y[1]) if both else y[0]

    def kernel(self, lags: Tensor) -> Tensor:
        """Exact expected kernel E[Q̄_d(m) K̄_d(n)] / R for m − n = lag (appendix A.1).

        Args:
            lags: (T,) integer lags.

        Returns:
            (H, D, T) values Σ_p Φ^Q_d(p) Φ^K_d(p − lag); zero where |lag| ≥ P.
        """
        lags = torch.as_tensor(lags, device=self.filters_q.device).long()
        p = torch.arange(self.kernel_size, device=lags.device)
        idx = p[None, :] - lags[:, None]  # (T, P): index into Φ^K
        valid = (idx >= 0) & (idx < self.kernel_size)
        fk = self.filters_k[:, :, idx.clamp(0, self.kernel_size - 1)] * valid  # (H, D, T, P)
        return (self.filters_q[:, :, None, :] * fk).sum(-1)

"""convSPE: vanishing relative kernels from filtered noise, eq. (22) and appendix A.1 of Liutkus et al. 2021.

Letters: L = length, H = num_heads, D = head_dim, R = num_realizations, P = kernel_size.

Orientation (causal, so decoding needs only past noise):
    Q̄_d(t) = Σ_{p<P} Φ^Q_d(p) Z_d(t − p),   K̄_d(t) = Σ_{p<P} Φ^K_d(p) Z_d(t − p),
    P_d(τ) = E[Q̄_d(m) K̄_d(n)] / R = Σ_p Φ^Q_d(p) Φ^K_d(p − τ),  zero for |τ| ≥ P.
With ``causal=False`` both codes read Z_d(t − p + c), c = ⌊(P − 1)/2⌋ (a centred filter);
the common shift leaves P_d(τ) unchanged.

Cost of a length-L code: (L + P − 1)·H·D·R Gaussian samples (the least any sampler of this
distribution needs, up to the P − 1 warm-up samples), drawn in time-last blocks and
concatenated; one real FFT of them, shared by Q̄ and K̄, and one inverse FFT per code, at a
5-smooth length; each code is then turned time-first, (L, H, D, R), by one 2-D transpose, so
that the layers sharing it apply it by batched matrix products. (Transforming a cache-sized
chunk of features at a time, with the noise time-first, was measured 2× slower on CPU: it
transposes the noise twice, in forward and in backward.) Long codes are not formed whole:
:func:`spe.ops.conv.conv_code_product` filters and applies them a block of positions at a time.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from spe.encodings.code import ConvCode, DenseCode
from spe.encodings.positions import (NOISE_DTYPE, check_code_seed, code_generator, require_positive,
                                     resolve_positions)
from spe.encodings.filter import SPEOptions, build_filter
from spe.encodings.spec import KeepsFullPrecision, PositionalSpec, head_dim, option
from spe.ops.conv.filters import direct_filter, fft_filter, fft_size

__all__ = ["NOISE_BLOCK", "ConvOptions", "ConvSPE", "SPEC", "fft_size"]

# Noise Z is indexed by absolute time and drawn in blocks of this many positions, each from
# its own seed, so a code for positions [0, N) agrees with the code for [0, N') on their
# common prefix on every device (needed when generation recomputes a growing prefix).
NOISE_BLOCK = 64


@functools.lru_cache(maxsize=4)
def _noise_block(seed: int, shape: tuple[int, ...]) -> Tensor:
    # Recurrent decoding asks for the same one or two blocks at every step: keep the last few.
    # Stored time-last, (H, D, R, NOISE_BLOCK): contiguous spans feed the FFT without a transpose.
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=NOISE_DTYPE)


class ConvSPE(KeepsFullPrecision):
    """Convolutional stochastic positional encoding (convSPE), eq. (22), 1-D.

    Args:
        num_heads: H.
        head_dim: D.
        num_realizations: R, default noise realisations per draw (default 32).
        kernel_size: P, filter length in positions; the kernel vanishes for |lag| ≥ P
            (default 64). Both defaults are :class:`~spe.models.ModelConfig`'s (tests keep
            them equal).
        impl: ``fft`` (real FFTs of spans of the noise, each shared by Q̄ and K̄, O(N log P),
            appendix A.2), ``direct`` (``conv1d``, O(N·P), the twin) or ``auto`` (fft: with
            spans of a power-of-two length it was measured 2.5-5× faster than ``conv1d``,
            forward and backward, at every P from 4 to 64, one thread, L = 2,048, 4 × 64
            features, R = 32). Same numbers either way.
        causal: True (default): the code at position t filters the noise at t − P + 1 … t,
            so decoding needs only past noise. False: a centred filter, noise at
            t − P + 1 + c … t + c with c = ⌊(P − 1)/2⌋, and an envelope centred on p = c
            (for encoders, e.g. Long Range Arena). Either way E[Q̄_d(m) K̄_d(n)] / R =
            Σ_p Φ^Q_d(p) Φ^K_d(p − (m − n)) (the shift is common to Q̄ and K̄), so
            :meth:`kernel` is the same formula; only the initial filters differ.
        code_seed: seed of the code drawn in eval mode without a ``generator`` (default 0):
            in ``eval()`` every call draws the same code, so a layer using it is
            deterministic; in training mode each call draws a new one.

    The filters stay float32 when a model is cast to bfloat16 or float16
    (:class:`~spe.encodings.spec.KeepsFullPrecision`; PyTorch's FFT has no bfloat16 form); the
    code is cast to the queries' dtype by :class:`~spe.encodings.filter.SPEFilter`.

    Raises:
        ValueError: if a size is not a positive integer or ``impl`` is unknown.
    """

    def __init__(self, num_heads: int, head_dim: int, num_realizations: int = 32,
                 kernel_size: int = 64, *, impl: str = "auto", causal: bool = True,
                 code_seed: int = 0) -> None:
        super().__init__()
        self.code_seed = check_code_seed("ConvSPE", code_seed)
        if impl not in ("auto", "fft", "direct"):
            raise ValueError(f"ConvSPE: impl must be 'auto', 'fft' or 'direct', got {impl!r}")
        if not isinstance(causal, bool):
            raise TypeError(f"ConvSPE: causal must be True or False, got {causal!r}")
        self.impl, self.causal = impl, causal
        require_positive("ConvSPE", num_heads=num_heads, head_dim=head_dim,
                         num_realizations=num_realizations, kernel_size=kernel_size)
        self.num_heads, self.head_dim = num_heads, head_dim
        self.num_realizations, self.kernel_size = num_realizations, kernel_size
        # A decaying envelope of unit norm: P_d(0) = 1 and the kernel decreases with |lag|;
        # a little noise breaks the symmetry between Φ^Q and Φ^K.
        taps = (torch.arange(kernel_size, dtype=torch.float32) - self.shift).abs()
        envelope = torch.exp(-taps / max(kernel_size / 4, 1))
        envelope = envelope / envelope.norm()
        base = envelope.expand(num_heads, head_dim, kernel_size)
        self.filters_q = nn.Parameter(base + 0.01 * torch.randn(base.shape) / math.sqrt(kernel_size))
        self.filters_k = nn.Parameter(base + 0.01 * torch.randn(base.shape) / math.sqrt(kernel_size))

    @property
    def shift(self) -> int:
        """c: the code at t filters the noise at t − p + c (0 when causal, ⌊(P − 1)/2⌋ when centred)."""
        return 0 if self.causal else (self.kernel_size - 1) // 2

    def noise(self, times: Tensor, num_realizations: int, seed: int) -> Tensor:
        """Z at integer absolute times ≥ −(P − 1), shape (N, H, D, R), N(0, 1) (float32, then cast).

        The same (seed, time) always gives the same values, whatever else is asked for.
        """
        idx = self._noise_index(times)
        shape = (self.num_heads, self.head_dim, num_realizations, NOISE_BLOCK)
        which = idx // NOISE_BLOCK
        z = torch.empty((idx.numel(),) + shape[:-1], dtype=NOISE_DTYPE)
        for b in torch.unique(which).tolist():
            rows = (which == b).nonzero().flatten()
            z[rows] = _noise_block(seed * (1 << 21) + b, shape)[..., idx[rows] % NOISE_BLOCK].permute(3, 0, 1, 2)
        return z.to(device=self.filters_q.device, dtype=self.filters_q.dtype)

    def noise_span(self, start: int, count: int, num_realizations: int, seed: int) -> Tensor:
        """Z at the times start … start + count − 1, time last: (H, D, R, count); equals
        ``noise(arange(start, start + count), ...)`` permuted, without a gather or a transpose
        (the noise blocks are stored time-last for the FFT)."""
        first = int(self._noise_index(torch.tensor([start]))[0])
        shape = (self.num_heads, self.head_dim, num_realizations, NOISE_BLOCK)
        blocks = [_noise_block(seed * (1 << 21) + b, shape)
                  for b in range(first // NOISE_BLOCK, (first + count - 1) // NOISE_BLOCK + 1)]
        z = torch.cat(blocks, dim=-1)[..., first % NOISE_BLOCK:first % NOISE_BLOCK + count]
        return z.to(device=self.filters_q.device, dtype=self.filters_q.dtype)

    def _noise_index(self, times: Tensor) -> Tensor:
        idx = times.cpu().long() + (self.kernel_size - 1)
        if idx.numel() and int(idx.min()) < 0:
            raise ValueError(f"ConvSPE: noise times must be ≥ −(P − 1) = {1 - self.kernel_size}, "
                             f"got {int(times.min())} (positions must be ≥ 0)")
        return idx

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
            generator: source of randomness (a seed for the noise blocks, and ε); default: in
                eval mode one seeded with ``code_seed`` (the same code at every call), in
                training mode PyTorch's default generator (a new code at every call).

        Returns:
            For the same contiguous positions for queries and keys (training, prefill), a
            :class:`ConvCode` (the noise span and the filters; its ``qbar`` and ``kbar`` are
            formed on first use); otherwise a :class:`DenseCode`. Either has qbar (Lq, H, D, R),
            kbar (Lk, H, D, R), gate_noise (H, D, R).

        Raises:
            ValueError: on missing, inconsistent, negative or non-integer positions, or a
                length or R that is not a positive integer.
        """
        pos_q, pos_k = resolve_positions(length, positions, query_positions, key_positions,
                                         device=self.filters_q.device, owner="ConvSPE")
        for pos in (pos_q, pos_k):
            if pos.is_floating_point() and not torch.equal(pos, pos.round()):
                raise ValueError("ConvSPE: positions must be integers (use SineSPE for real-valued positions)")
            if pos.numel() and int(pos.min()) < 0:
                raise ValueError(f"ConvSPE: positions must be ≥ 0, got {int(pos.min())}")
        r = self.num_realizations if num_realizations is None else num_realizations
        require_positive("ConvSPE", num_realizations=r)
        generator = code_generator(self, generator)
        seed = int(torch.randint(0, 1 << 31, (1,), generator=generator))
        eps = torch.randn(self.num_heads, self.head_dim, r, generator=generator, dtype=NOISE_DTYPE)
        eps = eps.to(device=self.filters_q.device, dtype=self.filters_q.dtype)
        if torch.equal(pos_q, pos_k) and _contiguous(pos_q):
            # The usual training and prefill case: the code stays factored (noise and filters),
            # so the filter may apply it block by block (``spe_impl``) or materialise it.
            p, start = self.kernel_size, int(pos_q[0]) + self.shift
            z = self.noise_span(start - p + 1, pos_q.numel() + p - 1, r, seed)
            return ConvCode(noise=z, filters_q=self.filters_q, filters_k=self.filters_k, use_fft=self.uses_fft,
                            gate_noise=eps)
        if torch.equal(pos_q, pos_k):
            qbar, kbar = self._filter(pos_q.long(), r, seed, both=True)
        else:
            qbar = self._filter(pos_q.long(), r, seed, both=False, filters=self.filters_q)
            kbar = self._filter(pos_k.long(), r, seed, both=False, filters=self.filters_k)
        return DenseCode(qbar=qbar, kbar=kbar, gate_noise=eps)

    def _filter(self, pos: Tensor, r: int, seed: int, *, both: bool,
                filters: Tensor | None = None):
        p, h, d, c = self.kernel_size, self.num_heads, self.head_dim, self.shift
        stacked = [self.filters_q, self.filters_k] if both else [filters]
        if not _contiguous(pos):
            # Arbitrary positions or one decoding step: explicit windows of P samples.
            times = pos[:, None] + c - torch.arange(p, device=pos.device)[None]  # (L, P)
            z = self.noise(times.flatten(), r, seed).view(pos.numel(), p, h, d, r)
            ys = [torch.einsum("lphdr,hdp->lhdr", z, f) for f in stacked]
        else:
            start = int(pos[0]) + c
            z = self.noise_span(start - p + 1, pos.numel() + p - 1, r, seed)  # (H, D, R, L + P − 1)
            conv = fft_filter if self.uses_fft else direct_filter
            ys = conv(z, stacked)
        return (ys[0], ys[1]) if both else ys[0]

    @property
    def uses_fft(self) -> bool:
        """Whether contiguous spans of noise are filtered by FFT (``impl`` fft or auto)."""
        return self.impl in ("fft", "auto")

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


def _contiguous(pos: Tensor) -> bool:
    return pos.numel() > 1 and bool((pos.diff() == 1).all())


@dataclass(kw_only=True)
class ConvOptions:
    """convSPE's own options (with :class:`~spe.encodings.filter.SPEOptions`).

    Attributes:
        kernel_size: P, the filter length in positions (per axis on a 2-D grid).
    """

    kernel_size: int = option(64, "P, filter length (convspe)", flag_type=int)

    def check_options(self) -> None:
        """Raises ValueError on P that is not a positive integer."""
        require_positive(type(self).__name__, kernel_size=self.kernel_size)


def build_conv(config) -> ConvSPE:
    """The model's convSPE code generator from a model config (R, P); an encoder
    (``config.causal`` False) takes the centred filter, whose kernel covers both signs of the lag."""
    return ConvSPE(config.num_heads, head_dim(config), config.num_realizations, config.kernel_size,
                   causal=getattr(config, "causal", True))


SPEC = PositionalSpec("convspe", "queries-keys", stochastic=True, windowed_by_default=True,
                      source="Liutkus et al. 2021, eq. (22)", model_module=build_conv, layer_module=build_filter,
                      options=(SPEOptions, ConvOptions))

"""Fourier mixing, fast forms: FNet's 2-D DFT and its causal twin by chirp convolution.

Letters: B = batch, L = length, C = channels, N = the causal form's DFT length, P = the FFT
size of a chirp convolution (a power of two ≥ 2L − 1).

Both forms first transform each position's channels, u = F_C x (complex), then mix positions:

* FNet (Lee-Thorp et al. 2022, sec. 3): y = Re(F_L u), one FFT over the length;
* the causal twin: y_m = Re(s Σ_{n≤m} w^{m n} u_n), w = exp(−2πi / N), the lower triangle of
  the N-point DFT matrix. With m n = (m² + n² − (m − n)²) / 2 (Bluestein's identity),

      y_m = Re(s · w^{m²/2} Σ_{n≤m} w^{−(m−n)²/2} (w^{n²/2} u_n)),

  a causal convolution of the chirped input with a chirp, by FFT: O(L log L) for any L and N.
  Chirp phases are reduced in integers (k² mod 2N) before the cosine and sine, so float32
  loses no phase at long lengths (w^{k²/2} at k = 16,384 is 2.7·10⁸ half-turns unreduced).

With a key padding mask FNet mixes each sequence over its own length (the same chirp
convolution with a per-sequence N), so a real position reads only real positions and never
depends on how much padding its batch has.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spe.ops.fourier.state import FourierState

__all__ = ["NORMS", "causal_fourier_mixing_with_state", "channel_transform", "chirp", "fourier_mixing",
           "fourier_scale"]

# "backward": no scale (FNet's, torch.fft's default name); "ortho": 1/√C on channels and 1/√N on
# positions (the unitary DFT), what the pre-norm blocks use (spe.attention.fourier).
NORMS = ("backward", "ortho")


def check_norm(norm: str) -> None:
    """Raises ValueError naming ``norm`` unless it is one of :data:`NORMS`."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")


def check_length(length) -> int:
    """N as an int; raises ValueError naming it unless it is a positive integer."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length (the DFT length N) must be a positive integer, got {length!r}")
    return length


def channel_transform(x: Tensor, norm: str) -> Tensor:
    """u = F_C x: (B, L, C) real -> (B, L, C) complex64 (complex128 for float64 x; bf16 and fp16
    are computed in float32)."""
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.fft.fft(x.to(work), dim=-1, norm=norm)


def fourier_scale(n: int | Tensor, norm: str):
    """s: 1 (``backward``) or 1/√n (``ortho``) for a DFT of n positions."""
    return 1.0 if norm == "backward" else (n ** -0.5 if isinstance(n, Tensor) else 1 / math.sqrt(n))


def chirp(k: Tensor, n: int | Tensor, dtype: torch.dtype) -> Tensor:
    """w^{k²/2} = exp(−πi (k² mod 2n) / n) for integer k (any shape, broadcast with n), in complex
    ``dtype``: the phase is reduced in int64 and formed in float64 before the cast."""
    n = torch.as_tensor(n, device=k.device)
    angle = torch.remainder(k * k, 2 * n).double() * -math.pi / n.double()
    return torch.complex(torch.cos(angle), torch.sin(angle)).to(dtype)


def _chirp_convolution(u: Tensor, pre: Tensor, kernel: Tensor, size: int) -> Tensor:
    """pre · (kernel ⊛ (pre · u)) over positions, the first L outputs of a circular convolution of
    ``size`` points: u (B, L, C); pre (B or 1, L); kernel (B or 1, P) laid out circularly."""
    n_pos = u.shape[1]
    a = torch.fft.fft(u * pre[..., None], n=size, dim=1)  # (B, P, C)
    out = torch.fft.ifft(a * torch.fft.fft(kernel, dim=-1)[..., None], dim=1)[:, :n_pos]
    return out * pre[..., None]


def _fft_size(n_pos: int) -> int:
    return 1 << max(2 * n_pos - 2, 1).bit_length()


def causal_fourier_mixing_with_state(x: Tensor, length: int, *, norm: str = "backward",
                                     initial_state: FourierState | None = None) -> tuple[Tensor, FourierState]:
    """The causal twin of FNet going on from a state, and the state after these positions.

    Positions run p … p + L − 1 (p = ``initial_state.position``, 0 without one):
    y_m = Re(s Σ_{n≤m} w^{m n} u_n) over every position since 0, the earlier ones through the
    state's S_{m mod N} (w^N = 1). Differentiable in x and in the state.

    Args:
        x: (B, L, C) real, L ≥ 1.
        length: N, the DFT length (a positive int).
        norm: ``backward`` (s = 1, u = F_C x) or ``ortho`` (s = 1/√N, u = F_C x / √C).
        initial_state: the :class:`FourierState` after position p − 1, or None.

    Returns:
        y (B, L, C) in x's dtype, and the state after position p + L − 1.

    Raises:
        ValueError: on a bad ``norm`` or ``length``, x not (B, L, C) with L ≥ 1, or a state of
            another batch, N or channel count.
    """
    check_norm(norm)
    n = check_length(length)
    if x.dim() != 3 or x.shape[1] == 0:
        raise ValueError(f"x must be (batch, length ≥ 1, channels), got {tuple(x.shape)}")
    u = channel_transform(x, norm)  # (B, L, C)
    b, n_pos, c = u.shape
    start = 0 if initial_state is None else initial_state.position
    if initial_state is not None and initial_state.sums.shape != (b, n, c):
        raise ValueError(f"the Fourier state holds sums {tuple(initial_state.sums.shape)}, expected "
                         f"(batch, N, channels) = {(b, n, c)}")
    m = torch.arange(start, start + n_pos, device=x.device)
    lags = torch.arange(n_pos, device=x.device)
    kernel = torch.zeros(_fft_size(n_pos), dtype=u.dtype, device=x.device)
    kernel[:n_pos] = chirp(lags, n, u.dtype).conj()  # w^{−k²/2}, k ≥ 0 only: causal
    mixed = _chirp_convolution(u, chirp(m, n, u.dtype)[None], kernel[None], kernel.shape[0])
    folded = torch.zeros(b, n, c, dtype=u.dtype, device=x.device).index_add(1, m % n, u)
    added = torch.fft.fft(folded, dim=1)  # Σ_n w^{f n} u_n over these positions, f = 0 … N − 1
    if initial_state is not None:
        mixed = mixed + initial_state.sums.to(u.dtype)[:, m % n]
        added = added + initial_state.sums.to(u.dtype)
    y = (mixed.real * fourier_scale(n, norm)).to(x.dtype)
    return y, FourierState(sums=added, position=start + n_pos)


def fourier_mixing(x: Tensor, *, causal: bool = False, length: int | None = None, norm: str = "backward",
                   key_padding_mask: Tensor | None = None) -> Tensor:
    """FNet's Fourier mixing y = Re(F_L(F_C(x))), or its causal twin.

    Non-causal (FNet, Lee-Thorp et al. 2022, sec. 3): y_m = Re(s Σ_{n<L} w_L^{m n} u_n), u = F_C x,
    w_L = exp(−2πi / L): every position reads every other, with no parameters. FNet mixes
    fixed-length padded inputs and has no mask; here a ``key_padding_mask`` (right padding)
    makes each sequence mix over its own length n_b: padded positions are left out (zeroed)
    and their outputs are 0, so a real position's output is that of the sequence alone.

    Causal: y_m = Re(s Σ_{n≤m} w^{m n} u_n), w = exp(−2πi / N) for a fixed N = ``length``:
    at m = N − 1 the full DFT row, beyond N the sums go on (position m reads frequency m mod N
    of its whole prefix). See :func:`causal_fourier_mixing_with_state`.

    Args:
        x: (B, L, C) float32 or float64 (bf16/fp16 are mixed in float32); complex64/128 inside.
        causal: the causal twin.
        length: N of the causal form (required there); None when not causal.
        norm: ``backward`` (FNet's: no scale) or ``ortho`` (1/√C on channels, 1/√N, or 1/√n_b
            with a mask, on positions: the unitary 2-D DFT at full length).
        key_padding_mask: (B, L) bool, True at padding, each row real positions then padding
            (non-causal only).

    Returns:
        (B, L, C) in x's dtype.

    Raises:
        ValueError: naming the argument: x not (B, L, C), a bad ``norm``, ``length`` missing or not
            a positive int with ``causal`` (or given without), a mask with ``causal``, of another
            shape, not bool or not right padding.
    """
    check_norm(norm)
    if x.dim() != 3:
        raise ValueError(f"x must be (batch, length, channels), got {tuple(x.shape)}")
    if causal:
        if key_padding_mask is not None:
            raise ValueError("causal Fourier mixing takes no key_padding_mask (right padding never reaches a "
                             "real position of a causal mix)")
        if x.shape[1] == 0:
            return x.clone()
        return causal_fourier_mixing_with_state(x, length, norm=norm)[0]
    if length is not None:
        raise ValueError(f"length (N = {length!r}) is the causal form's DFT length; FNet mixes over the "
                         f"sequence's own length: leave it out")
    if key_padding_mask is None:
        return (torch.fft.fft(channel_transform(x, norm), dim=1, norm=norm).real).to(x.dtype)
    return _masked_fourier_mixing(x, key_padding_mask, norm)


def _sequence_lengths(mask: Tensor, shape: torch.Size) -> Tensor:
    if mask.dtype != torch.bool or mask.shape != shape[:2]:
        raise ValueError(f"key_padding_mask must be a (batch, length) = {tuple(shape[:2])} bool tensor, got "
                         f"{tuple(mask.shape)} {mask.dtype}")
    lengths = (~mask).sum(1)  # (B,)
    if not torch.equal(mask, torch.arange(shape[1], device=mask.device)[None] >= lengths[:, None]):
        raise ValueError("key_padding_mask must be right padding (each row: real positions, then padding)")
    return lengths


def _masked_fourier_mixing(x: Tensor, mask: Tensor, norm: str) -> Tensor:
    """FNet over each sequence's own length n_b: a Bluestein DFT with a per-sequence chirp."""
    lengths = _sequence_lengths(mask, x.shape)
    if bool((lengths == x.shape[1]).all()):  # no padding in this batch: the plain FFT
        return fourier_mixing(x, norm=norm)
    n = lengths.clamp(min=1)[:, None]  # (B, 1); an empty row's outputs are 0
    real = (~mask)[..., None]
    u = channel_transform(x, norm) * real  # (B, L, C), padding left out
    n_pos = u.shape[1]
    size = _fft_size(n_pos)
    k = torch.arange(n_pos, device=x.device)
    kernel = torch.zeros(x.shape[0], size, dtype=u.dtype, device=x.device)
    h = chirp(k, n, u.dtype).conj()  # (B, L) w^{−k²/2}: lags 0 … L − 1, and − 1 … −(L − 1) wrapped
    kernel[:, :n_pos] = h
    kernel[:, size - n_pos + 1:] = h[:, 1:].flip(-1)
    mixed = _chirp_convolution(u, chirp(k, n, u.dtype), kernel, size)
    return (mixed.real * fourier_scale(n[..., None].to(mixed.real.dtype), norm) * real).to(x.dtype)

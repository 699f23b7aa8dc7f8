"""The causal Fourier mixer's decoding state (:class:`FourierState`).

Letters: B = batch, N = the DFT length, C = channels.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

__all__ = ["FourierState"]


@dataclass(frozen=True, kw_only=True)
class FourierState:
    """Causal Fourier mixing after ``position`` positions: every frequency of the prefix,

        S_f = Σ_{n < position} w^{f n} u_n,  f = 0 … N − 1,  w = exp(−2πi / N),

    u_n the channel transform of position n (:func:`spe.ops.fourier.fourier_mixing`). Position
    m reads S_{m mod N} after adding its own term, so the state must keep all N frequencies:
    O(N·C) numbers and O(N·C) work per token, whatever the position.

    Attributes:
        sums: (B, N, C) complex (complex64 for float32 inputs, complex128 for float64).
        position: positions seen so far.

    Raises:
        ValueError: on sums that are not (B, N, C) complex, or a position that is not an int ≥ 0.
    """

    sums: Tensor
    position: int = 0

    def __post_init__(self) -> None:
        if self.sums.dim() != 3 or not self.sums.is_complex():
            raise ValueError(f"FourierState: sums must be (batch, N, channels) complex, got "
                             f"{tuple(self.sums.shape)} {self.sums.dtype}")
        if isinstance(self.position, bool) or not isinstance(self.position, int) or self.position < 0:
            raise ValueError(f"FourierState: position must be an int ≥ 0, got {self.position!r}")

    @property
    def length(self) -> int:
        """N, the DFT length the sums are taken at."""
        return self.sums.shape[1]

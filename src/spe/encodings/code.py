"""Positional codes: one draw of SPE noise, applied to queries and keys by :class:`SPEFilter`.

Letters: L = length, H = num_heads, D = head_dim, R = num_realizations, K = num_sines.

A code is drawn once per forward pass and shared by every layer and every example of the
batch (appendix A.2 of Liutkus et al. 2021). Two forms exist:

* :class:`SineCode` keeps sineSPE factored (the cos/sin features and the gain-scaled noise)
  so that the filter can apply it as one matrix product without ever forming the
  (L, H, D, R) tensors of eq. (20)-(21).
* :class:`ConvCode` keeps convSPE factored (the noise span and the two filters), so that the
  filter can apply it a block of positions at a time (:func:`spe.ops.conv.conv_code_product`)
  or materialise it once for every layer.
* :class:`DenseCode` holds materialised codes Q̄, K̄ of shape (L, H, D, R) (convSPE at
  arbitrary positions and in decoding, 2-D convSPE).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from spe.ops.conv.filters import direct_filter, fft_filter
from spe.ops.sine.phases import sine_features

__all__ = ["ConvCode", "DenseCode", "SPECode", "SineCode"]


@dataclass(frozen=True)
class SineCode:
    """Factored sineSPE code, eq. (20)-(21).

    Attributes:
        frequencies: (H, D, K) f in cycles per position.
        phases: (H, D, K) θ in radians (query side only).
        query_positions: (Lq,) positions of the queries (integer or real).
        key_positions: (Lk,) positions of the keys.
        weights: (H, D, 2K, R) diag(λ̈) Z / √(2K).
        gate_noise: (H, D, R) the gating noise ε of eq. (23)-(25), N(0, 1).
    """

    frequencies: Tensor
    phases: Tensor
    query_positions: Tensor
    key_positions: Tensor
    weights: Tensor
    gate_noise: Tensor

    @property
    def num_realizations(self) -> int:
        return self.weights.shape[-1]

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        """(Lq, Lk, H, D): the query and key lengths, heads and features the code is for."""
        lq, lk = self.query_positions.shape[0], self.key_positions.shape[0]
        return (lq, lk, *self.weights.shape[:2])

    @property
    def num_elements(self) -> int:
        """Elements of the materialised Q̄ (Lq·H·D·R)."""
        return self.query_positions.shape[0] * self.weights.shape[0] * self.weights.shape[1] * self.weights.shape[-1]

    @cached_property
    def omega_q(self) -> Tensor:
        """(Lq, H, D, 2K) cos/sin of 2π f n + θ at the query positions."""
        return sine_features(self.frequencies, self.query_positions, self.phases)

    @cached_property
    def omega_k(self) -> Tensor:
        """(Lk, H, D, 2K) cos/sin of 2π f n at the key positions."""
        return sine_features(self.frequencies, self.key_positions, None)

    @cached_property
    def _materialized(self) -> tuple[Tensor, Tensor]:
        # einsum returns a permuted view of its (H, D, L, R) product; without one contiguous
        # copy here, every layer's code product would make (and keep for backward) its own.
        qbar = torch.einsum("lhdj,hdjr->lhdr", self.omega_q, self.weights).contiguous()
        kbar = torch.einsum("lhdj,hdjr->lhdr", self.omega_k, self.weights).contiguous()
        return qbar, kbar

    def materialize(self) -> tuple[Tensor, Tensor]:
        """Returns Q̄ (Lq, H, D, R) and K̄ (Lk, H, D, R) of eq. (20)-(21), computed once per code
        (every layer that shares the code reuses them)."""
        return self._materialized


@dataclass(frozen=True)
class DenseCode:
    """Materialised code.

    Attributes:
        qbar: (Lq, H, D, R) query code Q̄.
        kbar: (Lk, H, D, R) key code K̄.
        gate_noise: (H, D, R) the gating noise ε of eq. (23)-(25), N(0, 1).
    """

    qbar: Tensor
    kbar: Tensor
    gate_noise: Tensor

    @property
    def num_realizations(self) -> int:
        return self.qbar.shape[-1]

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        """(Lq, Lk, H, D): the query and key lengths, heads and features the code is for."""
        return (self.qbar.shape[0], self.kbar.shape[0], *self.qbar.shape[1:3])

    def materialize(self) -> tuple[Tensor, Tensor]:
        """Returns Q̄ (Lq, H, D, R) and K̄ (Lk, H, D, R)."""
        return self.qbar, self.kbar


@dataclass(frozen=True)
class ConvCode:
    """Factored convSPE code of eq. (22) for the same contiguous query and key positions.

    Attributes:
        noise: (H, D, R, L + P − 1) Z, time last: position t's codes filter samples t … t + P − 1.
        filters_q: (H, D, P) Φ^Q.
        filters_k: (H, D, P) Φ^K.
        use_fft: filter by FFT (else by direct convolution); same numbers.
        gate_noise: (H, D, R) the gating noise ε of eq. (23)-(25), N(0, 1).
    """

    noise: Tensor
    filters_q: Tensor
    filters_k: Tensor
    use_fft: bool
    gate_noise: Tensor

    @property
    def num_realizations(self) -> int:
        return self.noise.shape[2]

    @property
    def length(self) -> int:
        return self.noise.shape[-1] - self.filters_q.shape[-1] + 1

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        """(Lq, Lk, H, D): the query and key lengths, heads and features the code is for."""
        return (self.length, self.length, *self.noise.shape[:2])

    @property
    def num_elements(self) -> int:
        """Elements of the materialised Q̄ (L·H·D·R)."""
        return self.length * self.noise.shape[0] * self.noise.shape[1] * self.noise.shape[2]

    @cached_property
    def _materialized(self) -> tuple[Tensor, Tensor]:
        qbar, kbar = (fft_filter if self.use_fft else direct_filter)(self.noise, [self.filters_q, self.filters_k])
        return qbar, kbar

    def materialize(self) -> tuple[Tensor, Tensor]:
        """Returns Q̄ (L, H, D, R) and K̄ (L, H, D, R), formed once per code (every layer
        that shares the code reuses them)."""
        return self._materialized

    @property
    def qbar(self) -> Tensor:
        """(L, H, D, R) Q̄, materialised."""
        return self._materialized[0]

    @property
    def kbar(self) -> Tensor:
        """(L, H, D, R) K̄, materialised."""
        return self._materialized[1]


SPECode = SineCode | ConvCode | DenseCode

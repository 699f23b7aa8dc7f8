"""The constant decay's (RetNet's) chunked helpers: the decayed running maximum of key log
scales and the bidirectional (encoder) sums; the causal sums themselves run through
:mod:`spe.ops.common.scaled` with ``log_decay``. The gates' chunked sums are in
:mod:`spe.ops.decay.gated`.

Letters: B = batch, L = length, H = num_heads, M = feature dimension of φ, E = value dimension.

With key log scales (FAVOR+, :mod:`spe.ops.common.scaled`) a decay is a shift of the log scale: a
state S relative to e^c after position m − 1 is γ S = S relative to e^{c + λ} at position m.
So the sums are kept relative to the *decayed* running maximum
c_m = max(c_{m−1} + λ, a_m) = max_{n ≤ m} (a_n + (m − n) λ) (:func:`decayed_running_max`),
which keeps every factor e^{a_n + (m−n)λ − c_m} ≤ 1 and follows the keys that still weigh:
a huge key long forgotten does not hold the scale up and underflow the recent ones.
Kernels without key scales run the same sums with a_n = 0 (then c_m = 0 exactly). Powers are
only ever formed for lags inside a chunk or whole numbers of chunks (γ^{lag} = e^{lag·λ}),
never for an absolute position.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.common.chunk import causal_sums
from spe.ops.decay.forms import FLOOR_LOG_SCALE

__all__ = ["bidirectional_decay_sums", "decayed_running_max"]


def decayed_running_max(a: Tensor, log_decay: Tensor, previous: Tensor | None = None) -> Tensor:
    """c_m = max(previous + (m + 1) λ, max_{n ≤ m} (a_n + (m − n) λ)) along dim 1.

    By doubling (max-plus prefix: x_m ← max(x_m, x_{m−d} + d λ) for d = 1, 2, 4, …), so only
    lags up to L appear, O(L log L) elementwise work. Detach λ before calling when c is only a
    reference scale (the outputs do not depend on it).

    Args:
        a: (B, L, H) log scales; log_decay: (H,) λ ≤ 0; previous: (B, H) the scale at
            position −1, or None.

    Returns:
        (B, L, H).
    """
    x = a if previous is None else torch.cat([previous[:, None].to(a), a], dim=1)
    lam = log_decay.to(a)
    d = 1
    while d < x.shape[1]:
        x = torch.cat([x[:, :d], torch.maximum(x[:, d:], x[:, :-d] + d * lam)], dim=1)
        d *= 2
    return x if previous is None else x[:, 1:]


def bidirectional_decay_sums(phi_q: Tensor, phi_k: Tensor, values: Tensor, log_scale: Tensor, log_decay: Tensor,
                             chunk_size: int) -> tuple[Tensor, Tensor]:
    """Σ_n γ^{|m−n|} φ(q_m)ᵀ f_n e^{a_n} values_n for every m, unnormalised, in O(L) memory.

    A forward causal scan (n ≤ m, the diagonal included) and a backward one over the keys
    shifted by one (n ≥ m + 1, so the diagonal is counted once), its result times γ; each is
    relative to its own decayed running maximum, and the two are added relative to the larger.

    Args:
        phi_q, phi_k: (B, L, H, M), keys relative to e^{a_n}; values: (B, L, H, E).
        log_scale: (B, L, H) a_n (zeros for keys without scales; padding at −∞ or
            :data:`FLOOR_LOG_SCALE`); log_decay: (H,) λ; chunk_size: C of the scans.

    Returns:
        (B, L, H, E) sums relative to e^{s_m}, and s (B, L, H).
    """
    a = log_scale.clamp(min=FLOOR_LOG_SCALE)  # −∞ (padding) would meet −∞ − (−∞) in the scans

    def scan(q: Tensor, k: Tensor, vals: Tensor, scales: Tensor) -> tuple[Tensor, Tensor]:
        c = decayed_running_max(scales, log_decay.detach())
        k = k * torch.exp(scales - c)[..., None]
        return causal_sums(q, k, vals, chunk_size, None, scale=c, log_decay=log_decay)[0], c

    forward, c_f = scan(phi_q, phi_k, values, a)
    flip = lambda t: t.flip(1)  # noqa: E731
    shifted = [torch.cat([t[:, 1:], torch.zeros_like(t[:, :1])], dim=1) for t in (phi_k, values)]
    a_next = torch.cat([a[:, 1:], torch.full_like(a[:, :1], FLOOR_LOG_SCALE)], dim=1)
    backward, c_b = scan(flip(phi_q), flip(shifted[0]), flip(shifted[1]), flip(a_next))
    backward, c_b = flip(backward), flip(c_b) + log_decay.to(a)  # times γ: n − m = 1 + the scan's lag
    top = torch.maximum(c_f, c_b)
    return forward * torch.exp(c_f - top)[..., None] + backward * torch.exp(c_b - top)[..., None], top

"""Error of SPE's Monte-Carlo estimates versus R, for Gaussian and variance-reduced noise."""

from __future__ import annotations

import math

import torch

from spe.encodings.filter import SPEFilter
from spe.encodings.sine import SineSPE

__all__ = ["code_errors"]


@torch.no_grad()
def code_errors(realizations: list[int], *, num_heads: int = 4, head_dim: int = 64, num_sines: int = 5,
                length: int = 64, draws: int = 8, seed: int = 0) -> list[dict]:
    """RMS errors of sineSPE estimates for each R and noise kind.

    * ``kernel_rms``: of Q̄_d K̄_dᵀ / R against P_d(m − n) (per feature, all pairs m, n);
    * ``logit_rms``: of the attention exponent q̂·k̂ / √R against Σ_d q_d P_d(m−n) k_d / √D
      (eq. 8) for standard normal queries and keys.

    Returns:
        One dict per (R, noise): ``num_realizations``, ``noise``, ``kernel_rms``, ``logit_rms``.
    """
    torch.manual_seed(seed)
    enc = SineSPE(num_heads, head_dim, 8, num_sines).double()
    enc.phases.data.uniform_(-math.pi, math.pi)
    enc.frequency_logits.data.normal_(-3.0, 1.5)
    filt = SPEFilter(num_heads, head_dim, gated=False).double()
    pos = torch.arange(length, dtype=torch.float64)
    lags = pos[:, None] - pos[None, :]
    kern = enc.kernel(lags.flatten()).view(num_heads, head_dim, length, length)  # (H, D, M, N)
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(1, length, num_heads, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(1, length, num_heads, head_dim, generator=g, dtype=torch.float64)
    exact_logits = torch.einsum("bmhd,hdmn,bnhd->bhmn", q, kern, k) / math.sqrt(head_dim)
    rows = []
    for r in realizations:
        for noise in ("gaussian", "orthogonal"):
            enc.noise = noise
            k_err, l_err = 0.0, 0.0
            for i in range(draws):
                code = enc(length, num_realizations=r, generator=torch.Generator().manual_seed(1000 * r + i))
                qbar, kbar = code.materialize()
                est = torch.einsum("mhdr,nhdr->hdmn", qbar, kbar) / r
                k_err += float((est - kern).pow(2).mean())
                qh, kh = filt(q, k, code)
                l_err += float((torch.einsum("bmhr,bnhr->bhmn", qh, kh) / math.sqrt(r) - exact_logits).pow(2).mean())
            rows.append({"num_realizations": r, "noise": noise, "kernel_rms": math.sqrt(k_err / draws),
                         "logit_rms": math.sqrt(l_err / draws)})
    return rows

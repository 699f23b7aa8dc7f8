"""PaTH's per-chunk terms, shared by the chunked form (:mod:`spe.ops.path.chunk`) and the
flash-style form (:mod:`spe.ops.path.flash`): the UT transform of a chunk's Householder-like
products (the equations are in :mod:`spe.ops.path.chunk`'s docstring).

Letters: B = batch, L = length, H = num_heads, D = head_dim, C = chunk length, N = number of chunks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["chunk_blocks", "chunk_terms"]


def chunk_blocks(x: Tensor, c: int) -> Tensor:
    """(B, L, H, ...) → (B, H, N, C, ...), zero-padded to N·C positions (w = β = 0 there: H = I)."""
    b, n, h = x.shape[:3]
    x = x.movedim(1, 2)  # (B, H, L, ...)
    x = F.pad(x, (0, 0, 0, (-n) % c) if x.dim() == 4 else (0, (-n) % c))
    return x.reshape(b, h, x.shape[2] // c, c, *x.shape[3:])  # not -1: undetermined at batch 0


def chunk_terms(q: Tensor | None, k: Tensor, w: Tensor, beta: Tensor, c: int):
    """The per-chunk terms of the module docstring, from (B, L, H, ·) inputs.

    Returns:
        (intra (B, H, N, C, C) or None, Q̂ (B, H, N, C, D) or None, K̂ (B, H, N, C, D),
        P (B, H, N, D, D)); the queries' terms are None without q.
    """
    k, w, beta = chunk_blocks(k, c), chunk_blocks(w, c), chunk_blocks(beta, c)
    eye = torch.eye(c, dtype=k.dtype, device=k.device)
    strict = torch.ones(c, c, dtype=torch.bool, device=k.device).tril(-1)
    wb = w * beta[..., None]  # diag(β) W
    lower = eye + (wb @ w.transpose(-1, -2)).masked_fill(~strict, 0)  # I + diag(β) tril₋₁(W Wᵀ)
    wk = (wb @ k.transpose(-1, -2)).masked_fill(~strict, 0)  # diag(β) tril₋₁(W Kᵀ)
    solved = torch.linalg.solve_triangular(lower, torch.cat([wb, wk], -1), upper=False, unitriangular=True)
    twb, twk = solved[..., :w.shape[-1]], solved[..., w.shape[-1]:]  # T diag(β) W, T diag(β) tril₋₁(W Kᵀ)
    k_hat = k - twk.transpose(-1, -2) @ w
    product = torch.eye(w.shape[-1], dtype=k.dtype, device=k.device) - w.transpose(-1, -2) @ twb
    if q is None:
        return None, None, k_hat, product
    q = chunk_blocks(q, c)
    qw = (q @ w.transpose(-1, -2)).tril()  # (B, H, N, C, C), s ≤ m
    intra = q @ k.transpose(-1, -2) - qw @ twk
    return intra, q - qw @ twb, k_hat, product

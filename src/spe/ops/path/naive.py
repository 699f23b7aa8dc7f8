"""PaTH attention by its definition, O(L²·D): the slow, obviously correct twin.

Letters: B = batch, L = length, H = num_heads, D = head_dim, E = value dimension.

PaTH (Yang et al. 2025, "PaTH attention: position encoding via accumulating Householder
transformations"): with H_t = I − β_t w_t w_tᵀ, query m attends to key n ≤ m with the logit

    s_mn = scale · q_mᵀ (H_m H_{m−1} ⋯ H_{n+1}) k_n  (+ F_m − F_n with a FoX gate, F = cumsum G),

the product empty for n = m, then a causal softmax. This form walks the lags: r_m ← H_{m−d+1} r_m
at lag d (r_m = q_m at lag 0) gives every query's row vector q_mᵀ H_m ⋯ H_{m−d+1} at once, so
its logit with key m − d is one dot product: L steps of O(L·D), no D × D matrix. It computes in
the widest of the inputs' dtypes and float32 (float64 inputs: a float64 reference).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spe.ops.path.checks import check_path_inputs

__all__ = ["path_attention_reference", "path_logits_reference"]


def path_logits_reference(q: Tensor, k: Tensor, w: Tensor, beta: Tensor) -> Tensor:
    """q_mᵀ H_m ⋯ H_{n+1} k_n for every n ≤ m, unscaled, 0 above the diagonal.

    Args:
        q, k, w: (B, L, H, D), w_t of unit norm; beta: (B, L, H).

    Returns:
        (B, H, L, L) in the inputs' dtype.
    """
    b, n, h, _ = q.shape
    logits = q.new_zeros(b, h, n, n)
    logits.diagonal(dim1=2, dim2=3).copy_((q * k).sum(-1).transpose(1, 2))  # lag 0: no H
    r = q
    for lag in range(1, n):
        r = r[:, 1:]  # the queries m = lag … L − 1
        w_t, beta_t = w[:, 1:n - lag + 1], beta[:, 1:n - lag + 1]  # H_{m−lag+1}
        r = r - beta_t[..., None] * (r * w_t).sum(-1, keepdim=True) * w_t
        logits.diagonal(offset=-lag, dim1=2, dim2=3).copy_((r * k[:, :n - lag]).sum(-1).transpose(1, 2))
    return logits


def path_attention_reference(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, *,
                             log_decay: Tensor | None = None, scale: float | None = None) -> Tensor:
    """Causal PaTH attention (PaTH-FoX with a gate), explicitly: softmax_n(s_mn) v_n over n ≤ m.

    Args:
        q, k, w: (B, L, H, D); v: (B, L, H, E); beta: (B, L, H) in [0, 2]; w_t unit norm.
        log_decay: (B, L, H) FoX gate G ≤ 0 (F_m − F_n as a difference of running sums: exact
            enough in float64), or None.
        scale: multiplies q·k (default 1/√D); the gate is not scaled.

    Returns:
        (B, L, H, E) in the compute dtype (the widest of the inputs' and float32).

    Raises:
        ValueError: as :func:`~spe.ops.path.path_attention`.
    """
    gates, scale = check_path_inputs(q, k, v, w, beta, log_decay=log_decay, scale=scale)
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype),
                                torch.promote_types(v.dtype, torch.float32))
    q, k, v, w, beta = (t.to(dtype) for t in (q, k, v, w, beta))
    n = q.shape[1]
    scores = path_logits_reference(q, k, w, beta) * scale
    if gates is not None:
        f = gates.to(dtype).cumsum(1).transpose(1, 2)  # (B, H, L)
        scores = scores + f[..., :, None] - f[..., None, :]
    future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    weights = scores.masked_fill(future, -math.inf).softmax(-1)  # (B, H, L, L)
    return torch.einsum("bhmn,bnhe->bmhe", weights, v)

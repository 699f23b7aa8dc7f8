"""Validation of PaTH attention's inputs, shared by the parallel, reference and decoding forms.

Letters: B = batch, L = length, H = num_heads, D = head_dim, E = value dimension.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spe.ops.softmax import softmax_gates

__all__ = ["check_path_inputs", "unit_tolerance"]


def unit_tolerance(dtype: torch.dtype) -> float:
    """How far ‖w_t‖ may be from 1 in ``dtype``: 1e-3, or 8 ulps of a coarser dtype (a unit
    vector rounded to bfloat16 has a norm off by up to ~4e-3)."""
    return max(1e-3, 8 * torch.finfo(dtype).eps)


def check_path_inputs(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, *,
                      log_decay: Tensor | None, scale: float | None) -> tuple[Tensor | None, float]:
    """Checks the shapes, dtypes and values of :func:`~spe.ops.path.path_attention`'s inputs.

    Args:
        q, k, w: (B, L, H, D); v: (B, L, H, E); beta: (B, L, H) in [0, 2]; w_t of unit norm (or 0);
        log_decay: (B, L, H) (or (H,), a constant) FoX gate ≤ 0, or None.
        scale: a positive finite float, or None for 1/√D.

    Returns:
        (the gate as (B, L, H) or None, the scale).

    Raises:
        ValueError: naming the tensor, the shape or dtype received and what is allowed.
    """
    for name, t in (("q", q), ("k", k), ("v", v), ("w", w), ("beta", beta)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be floating point, got dtype {t.dtype}")
    if q.dim() != 4:
        raise ValueError(f"q must be (batch, length, num_heads, head_dim), got shape {tuple(q.shape)}")
    for name, t in (("k", k), ("w", w)):
        if t.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)} (B, L, H, D), "
                             f"got {tuple(t.shape)}")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be (B, L, H, E) with q's (B, L, H) = {tuple(q.shape[:3])}, "
                         f"got {tuple(v.shape)}")
    if beta.shape != q.shape[:3]:
        raise ValueError(f"beta must be (B, L, H) = {tuple(q.shape[:3])}, got {tuple(beta.shape)}")
    if beta.numel() and not bool(((beta >= 0) & (beta <= 2)).all()):
        bad = beta[~((beta >= 0) & (beta <= 2))][0].item()
        raise ValueError(f"beta must lie in [0, 2] (H_t = I − β_t w_t w_tᵀ, 2·sigmoid(·) ∈ (0, 2)), "
                         f"got {bad}")
    if w.numel():
        norm = torch.linalg.vector_norm(w.float(), dim=-1)
        off = torch.minimum((norm - 1).abs(), norm)  # unit, or ~0 (H_t ≈ I: F.normalize of a zero row)
        if not bool((off <= unit_tolerance(w.dtype)).all()):  # NaN fails too
            worst = off.nan_to_num(math.inf).flatten().argmax()
            raise ValueError(f"w must have unit norm along head_dim (normalise it first, e.g. F.normalize(w, "
                             f"dim=-1)); a ‖w_t‖ of {norm.flatten()[worst].item():.3g} was received")
    if scale is None:
        scale = 1 / math.sqrt(q.shape[-1])
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
        raise ValueError(f"scale must be a positive finite float or None (1/√D), got {scale!r}")
    gates = None if log_decay is None else softmax_gates(log_decay, tuple(q.shape))
    return gates, float(scale)

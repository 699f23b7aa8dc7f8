"""Feature maps φ for linear attention: ReLU, elu + 1, and FAVOR+ (Choromanski et al. 2021).

Letters: B = batch, L = length, H = num_heads, E = query/key dimension, M = num_features.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["elu_feature_map", "favor_feature_map", "orthogonal_random_features", "relu_feature_map"]


def elu_feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1 (Katharopoulos et al. 2020). (…, E) -> (…, E), positive."""
    return F.elu(x) + 1


def relu_feature_map(x: Tensor) -> Tensor:
    """φ(x) = relu(x). (…, E) -> (…, E), non-negative."""
    return F.relu(x)


def orthogonal_random_features(num_heads: int, num_features: int, dim: int, *,
                               generator: torch.Generator | None = None) -> Tensor:
    """Orthogonal Gaussian projections for FAVOR+, one independent set per head.

    Rows come in blocks of ``dim`` mutually orthogonal directions (QR of a Gaussian matrix),
    each scaled by the norm of an independent Gaussian vector so that every row is marginally
    N(0, I_dim).

    Returns:
        (H, M, E) projection matrix ω.
    """
    heads = []
    for _ in range(num_heads):
        blocks, rows = [], 0
        while rows < num_features:
            q, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator))
            # Sign-fix so q is Haar-distributed (otherwise directions are biased).
            blocks.append((q * torch.sign(torch.diagonal(r))).T)
            rows += dim
        w = torch.cat(blocks)[:num_features]
        norms = torch.randn(num_features, dim, generator=generator).norm(dim=1)
        heads.append(w * norms[:, None])
    return torch.stack(heads)


def favor_feature_map(x: Tensor, projection: Tensor, *, is_query: bool, eps: float = 1e-4) -> Tensor:
    """Positive random features of the softmax kernel exp(x·y / √E), FAVOR+.

    φ(x) = exp(ω x' − ‖x'‖²/2 − c) / √M with x' = x / E^{1/4}, so that
    E[φ(x)·φ(y)] ∝ exp(x·y / √E). Stabilisers that keep the attention causal and identical
    step by step (recurrent decoding):

    * queries: c = the row's own maximum (detached), which cancels in each query's ratio,
      and ``eps`` is added relative to that maximum;
    * keys: c = 0 and no data-dependent shift (a maximum over keys would let future keys change
      past outputs through rounding); the exponent is bounded by ‖ω‖²/2 anyway, and clamped
      at 80 so float32 cannot overflow.

    Args:
        x: (B, L, H, E) queries or keys.
        projection: (H, M, E) from :func:`orthogonal_random_features`.
        is_query: choose the stabiliser (see above).
        eps: floor added to query features.

    Returns:
        (B, L, H, M) features, computed in at least float32.
    """
    dim, m = x.shape[-1], projection.shape[1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    x = x.to(dtype) * dim ** -0.25
    wx = torch.einsum("blhe,hme->blhm", x, projection.to(dtype))
    logits = wx - 0.5 * (x * x).sum(-1, keepdim=True)
    if is_query:
        return (torch.exp(logits - logits.amax(dim=-1, keepdim=True).detach()) + eps) / math.sqrt(m)
    return torch.exp(logits.clamp(max=80.0)) / math.sqrt(m)

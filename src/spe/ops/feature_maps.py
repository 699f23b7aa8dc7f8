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


# Largest exponent a key feature may reach: e^60/√M per feature leaves float32 (max e^88.7)
# room for sums over L·|v| up to e^28 ≈ 10¹² (key counts times value sizes).
_KEY_HEADROOM = 60.0


def favor_feature_map(x: Tensor, projection: Tensor, *, is_query: bool, eps: float = 1e-4) -> Tensor:
    """Positive random features of the softmax kernel exp(x·y / √E), FAVOR+.

    φ(x)_j = exp(ω_j x' − ‖x'‖²/2 − c_j) / √M with x' = x / E^{1/4}, so that
    E[φ(x)·φ(y)] ∝ exp(x·y / √E). Stabilisers that keep the attention causal and identical
    step by step (recurrent decoding):

    * keys: c_j = max(0, ‖ω_j‖²/2 − 60), a constant of the projection (no data: a maximum over
      keys would let future keys change past outputs). Since ω_j x' − ‖x'‖²/2 ≤ ‖ω_j‖²/2, every
      key feature is at most e^60/√M, so no sum overflows float32 whatever the test-time R
      (the old clamp at 80 changed the kernel of keys near ω_j and let sums of 10⁵ keys
      overflow at R = 256);
    * queries: the same c_j is *added* (so each product φ(q)_j φ(k)_j, hence the kernel, is
      unchanged), then the row's own maximum (detached) is subtracted, which cancels in each
      query's ratio, and ``eps`` is added relative to that maximum.

    Computed in at least float32 with autocast off: under bf16 autocast the projection would
    run in bf16 and the exponent lose up to ~4 % (relative) of each feature.

    Args:
        x: (B, L, H, E) queries or keys.
        projection: (H, M, E) from :func:`orthogonal_random_features`.
        is_query: choose the stabiliser (see above).
        eps: floor added to query features.

    Returns:
        (B, L, H, M) features, in at least float32.
    """
    dim, m = x.shape[-1], projection.shape[1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(device_type=x.device.type, enabled=False):
        x = x.to(dtype) * dim ** -0.25
        projection = projection.to(dtype)
        wx = torch.einsum("blhe,hme->blhm", x, projection)
        shift = (0.5 * projection.square().sum(-1) - _KEY_HEADROOM).clamp(min=0.0)  # (H, M) c_j
        logits = wx - 0.5 * (x * x).sum(-1, keepdim=True)
        if is_query:
            logits = logits + shift
            return (torch.exp(logits - logits.amax(dim=-1, keepdim=True).detach()) + eps) / math.sqrt(m)
        return torch.exp(logits - shift) / math.sqrt(m)

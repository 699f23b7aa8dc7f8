"""Feature maps φ for linear attention: ReLU, elu + 1, and FAVOR+ (Choromanski et al. 2021).

Letters: B = batch, L = length, H = num_heads, E = query/key dimension, M = num_features.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["elu_feature_map", "favor_feature_map", "favor_key_features", "orthogonal_random_features",
           "relu_feature_map"]


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


def _favor_logits(x: Tensor, projection: Tensor) -> Tensor:
    """ω x' − ‖x'‖²/2 with x' = x / E^{1/4}, in at least float32 with autocast off (under bf16
    autocast the projection would run in bf16 and each feature lose up to ~4 %, relative)."""
    dim = x.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(device_type=x.device.type, enabled=False):
        x = x.to(dtype) * dim ** -0.25
        wx = torch.einsum("blhe,hme->blhm", x, projection.to(dtype))
        return wx - 0.5 * (x * x).sum(-1, keepdim=True)


def favor_feature_map(x: Tensor, projection: Tensor, *, is_query: bool, eps: float = 1e-4) -> Tensor:
    """Positive random features of the softmax kernel exp(x·y / √E), FAVOR+.

    φ(x) = exp(ω x' − ‖x'‖²/2 − c) / √M with x' = x / E^{1/4}, so that
    E[φ(x)·φ(y)] ∝ exp(x·y / √E). Stabilisers that keep the attention causal and identical
    step by step (recurrent decoding):

    * queries: c = the row's own maximum (detached), which cancels in each query's ratio,
      and ``eps`` is added relative to that maximum;
    * keys: c = 0, the exponent clamped at 80 so that float32 cannot overflow. The clamp
      changes the kernel of keys whose exponent exceeds 80 (possible at a large test-time R:
      the exponent is bounded by ‖ω_j‖²/2 ≈ R/2): the attention layer uses
      :func:`favor_key_features` instead, whose scale the kernels carry exactly.

    Args:
        x: (B, L, H, E) queries or keys.
        projection: (H, M, E) from :func:`orthogonal_random_features`.
        is_query: choose the stabiliser (see above).
        eps: floor added to query features.

    Returns:
        (B, L, H, M) features, in at least float32 (also under autocast).
    """
    m = projection.shape[1]
    logits = _favor_logits(x, projection)
    if is_query:
        return (torch.exp(logits - logits.amax(dim=-1, keepdim=True).detach()) + eps) / math.sqrt(m)
    return torch.exp(logits.clamp(max=80.0)) / math.sqrt(m)


def favor_key_features(x: Tensor, projection: Tensor) -> tuple[Tensor, Tensor]:
    """FAVOR+ key features with their scale apart: φ(k_n) = features_n · exp(log_scale_n).

    Each key is divided by its own largest feature (detached), so features lie in (0, 1/√M]
    whatever R and the keys' norms; the kernels take ``key_log_scale`` and bring keys to a
    common scale with a causal running maximum (:func:`spe.ops.linear.causal_linear_attention`),
    so nothing overflows and no key's weight is clipped (issue 12, defect 6).

    Args:
        x: (B, L, H, E) keys.
        projection: (H, M, E).

    Returns:
        features (B, L, H, M) and log_scale (B, L, H), in at least float32.
    """
    logits = _favor_logits(x, projection)
    log_scale = logits.amax(dim=-1).detach()
    return torch.exp(logits - log_scale[..., None]) / math.sqrt(projection.shape[1]), log_scale

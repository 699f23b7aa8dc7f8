"""Feature maps φ for linear attention: ReLU, elu + 1, and FAVOR+ (Choromanski et al. 2021).

Letters: B = batch, L = length, H = num_heads, E = query/key dimension, M = num_features.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["ScaledFeatures", "elu_feature_map", "favor_feature_map", "favor_key_features",
           "orthogonal_random_features", "relu_feature_map", "split_key_features"]


@dataclass(frozen=True, eq=False)
class ScaledFeatures:
    """Key features that travel with their scale: φ(k_n) = features_n · exp(log_scale_n).

    What :func:`favor_key_features` returns. Pass it whole as ``phi_k`` to any linear kernel
    (:func:`~spe.ops.linear_attn.linear_attention`, :func:`~spe.ops.linear_attn.causal_linear_attention`,
    :func:`~spe.ops.linear_attn.linear_attention_step`, …): the kernel reads the scale, as if
    given ``key_log_scale=log_scale``. ``features`` alone is *not* φ(k) (each key is divided by
    its own largest feature), so the object does not unpack like a tuple: that would make it
    easy to pass the features without their scale, a silently different attention.

    Attributes:
        features: (B, L, H, M) features relative to the scale, in (0, 1/√M] for FAVOR+.
        log_scale: (B, L, H) a_n, natural log of each key's scale.

    Raises:
        ValueError: if ``log_scale``'s shape is not ``features``' without its last axis.
    """

    features: Tensor
    log_scale: Tensor

    def __post_init__(self) -> None:
        if tuple(self.log_scale.shape) != tuple(self.features.shape[:-1]):
            raise ValueError(f"ScaledFeatures: log_scale must have the features' shape without the last "
                             f"axis, {tuple(self.features.shape[:-1])}, got {tuple(self.log_scale.shape)}")

    def __iter__(self):
        # refuse tuple unpacking (the return type of earlier versions): see the class docstring
        raise TypeError("ScaledFeatures is not a (features, log_scale) tuple: pass it whole as phi_k (the "
                        "kernels read its scale), or pass .features together with key_log_scale=.log_scale")

    def positions(self, index: slice | int) -> ScaledFeatures:
        """The features and scales of some positions (axis 1): ``positions(slice(a, b))``, or
        ``positions(t)``, position t with the axis kept (features (B, 1, H, M), log_scale
        (B, 1, H)), what one decoding step takes."""
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
        return ScaledFeatures(self.features[:, index], self.log_scale[:, index])


def split_key_features(phi_k: Tensor | ScaledFeatures, key_log_scale: Tensor | None, *,
                       who: str = "linear attention") -> tuple[Tensor, Tensor | None]:
    """(features, log scale or None) of a kernel's ``phi_k`` and ``key_log_scale`` arguments.

    Raises:
        ValueError: if ``phi_k`` is :class:`ScaledFeatures` and ``key_log_scale`` is given too
            (two scales for the same keys).
    """
    if not isinstance(phi_k, ScaledFeatures):
        return phi_k, key_log_scale
    if key_log_scale is not None:
        raise ValueError(f"{who}: phi_k is ScaledFeatures, which carries its own log scale; pass "
                         "key_log_scale=None (got a tensor too)")
    return phi_k.features, phi_k.log_scale


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


def favor_key_features(x: Tensor, projection: Tensor) -> ScaledFeatures:
    """FAVOR+ key features with their scale apart: φ(k_n) = features_n · exp(log_scale_n).

    Each key is divided by its own largest feature (detached), so features lie in (0, 1/√M]
    whatever R and the keys' norms; the kernels read the scale from the returned
    :class:`ScaledFeatures` (pass it as ``phi_k``) and bring keys to a common scale with a
    causal running maximum (:func:`spe.ops.linear_attn.causal_linear_attention`), so nothing
    overflows and no key's weight is clipped.

    Args:
        x: (B, L, H, E) keys.
        projection: (H, M, E).

    Returns:
        :class:`ScaledFeatures` with features (B, L, H, M) and log_scale (B, L, H), in at
        least float32.
    """
    logits = _favor_logits(x, projection)
    log_scale = logits.amax(dim=-1).detach()
    features = torch.exp(logits - log_scale[..., None]) / math.sqrt(projection.shape[1])
    return ScaledFeatures(features, log_scale)

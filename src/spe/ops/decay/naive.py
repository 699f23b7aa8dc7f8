"""The float64 reference of linear attention with a decay: the explicit O(L²) sum for the
constant decay, the scalar gate and the channel gate alike (:mod:`spe.ops.decay.forms`).

Letters: B = batch, L = length, H = num_heads, M = feature dimension of φ, E = value dimension.

    y_m = Σ_n w_mn φ(q_m)·φ(k_n) v_n / Σ_n w_mn φ(q_m)·φ(k_n)   (n ≤ m when causal)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spe.ops.common.checks import reference_keep
from spe.ops.decay.forms import ConstantDecay, decay_form
from spe.ops.common.feature_maps import split_key_features

__all__ = ["decay_attention_reference"]


def _lag_weights(n: int, log_decay: Tensor, *, causal: bool, window: int | None,
                 key_padding_mask: Tensor | None) -> Tensor:
    """γ^{|m − n|} with the causal, window and padding masks: (B or 1, H, L, L)."""
    pos = torch.arange(n, device=log_decay.device)
    lag = pos[:, None] - pos[None, :]
    w = torch.exp(lag.abs().to(log_decay)[None] * log_decay[:, None, None])[None]
    return w * reference_keep(n, n, log_decay.device, causal=causal, window=window, key_padding_mask=key_padding_mask)


def _gate_weights(gates: Tensor, *, causal: bool, window: int | None, key_padding_mask: Tensor | None) -> Tensor:
    """exp(F_m − F_n) (n ≤ m), exp(F_n − F_m) (n > m), F the running sums of the gates (B, L, H, G),
    with the causal, window and padding masks: (B, H, L, L, G)."""
    g = gates
    f = torch.cumsum(g, dim=1).permute(0, 2, 1, 3)  # (B, H, L, G)
    diff = f[:, :, :, None] - f[:, :, None, :]  # F_m − F_n
    pos = torch.arange(g.shape[1], device=g.device)
    later = (pos[:, None] >= pos[None, :])[..., None]  # n ≤ m
    keep = reference_keep(g.shape[1], g.shape[1], g.device, causal=causal, window=window, key_padding_mask=key_padding_mask)
    return torch.exp(torch.where(later, diff, -diff)) * keep[..., None]


def decay_attention_reference(phi_q: Tensor, phi_k: Tensor, v: Tensor, log_decay: Tensor, *, causal: bool = True,
                              window: int | None = None, normalizer: tuple[Tensor, Tensor] | None = None,
                              key_log_scale: Tensor | None = None,
                              key_padding_mask: Tensor | None = None) -> Tensor:
    """The explicit O(L²) sum, in float64: y_m = Σ_n w_mn φ(q_m)·φ(k_n) v_n / Σ_n w_mn ψ(q_m)·ψ(k_n)
    with w_mn = γ^{|m−n|} (n ≤ m when causal, m − n < W with a window, n not padding).
    With a gate (:mod:`spe.ops.decay.forms`) w_mn = exp(F_m − F_n) for n ≤ m, F_t = Σ_{s≤t} G_s
    (per feature channel for a channel gate, inside the dot products), and exp(F_n − F_m) for
    n > m without ``causal`` (the gates of the positions between, as for γ^{|m−n|}).
    For tests; memory O(B·H·L²) (O(B·H·L²·M) with a channel gate).

    Args:
        phi_q, phi_k: (B, L, H, M); v: (B, L, H, E); log_decay: (H,) λ = log γ, or a gate
            (B, L, H) or (B, L, H, M).
        causal, window: as :func:`~spe.ops.linear_attn.causal_linear_attention`.
        normalizer: (ψ(q), ψ(k)) (B, L, H, M') for the denominator, or None (ψ = φ).
        key_log_scale: (B, L, H) a_n, φ(k_n) = phi_k_n · e^{a_n} (taken relative to the
            largest a_n of each example and head; keep them within ±700 nats); None when
            ``phi_k`` is :class:`~spe.ops.common.feature_maps.ScaledFeatures`, which carries it.
        key_padding_mask: (B, L) bool, True at padding.

    Returns:
        (B, L, H, E) in float64.
    """
    phi_k, key_log_scale = split_key_features(phi_k, key_log_scale, who="decay_attention_reference")
    f64 = torch.float64
    phi_q, phi_k, v, lam = phi_q.to(f64), phi_k.to(f64), v.to(f64), log_decay.to(f64)
    nq, nk = (phi_q, phi_k) if normalizer is None else (normalizer[0].to(f64), normalizer[1].to(f64))
    if key_log_scale is not None:
        a = key_log_scale.to(f64)
        if key_padding_mask is not None:
            a = a.masked_fill(key_padding_mask[..., None], -math.inf)
        top = a.amax(dim=1, keepdim=True)
        factor = torch.exp(a - top.masked_fill(top == -math.inf, 0.0))[..., None]
        phi_k, nk = phi_k * factor, nk * factor
    form = decay_form(lam)
    if isinstance(form, ConstantDecay):
        w = _lag_weights(phi_q.shape[1], lam, causal=causal, window=window, key_padding_mask=key_padding_mask)
        num = torch.einsum("bmhd,bnhd,bhmn,bnhe->bmhe", phi_q, phi_k, w, v)
        den = torch.einsum("bmhd,bnhd,bhmn->bmh", nq, nk, w)[..., None]
    else:
        w = _gate_weights(form.gates, causal=causal, window=window, key_padding_mask=key_padding_mask)
        num = torch.einsum("bmhd,bnhd,bhmnd,bnhe->bmhe", phi_q, phi_k, w.expand(*w.shape[:4], phi_q.shape[-1]), v)
        den = torch.einsum("bmhd,bnhd,bhmnd->bmh", nq, nk, w.expand(*w.shape[:4], nq.shape[-1]))[..., None]
    nonzero = den != 0
    return torch.where(nonzero, num / torch.where(nonzero, den, torch.ones_like(den)), torch.zeros_like(num))

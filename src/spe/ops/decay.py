"""Decay on the lag (RetNet's retention, Sun et al. 2023): the helpers and the slow reference.

Letters: B = batch, L = length, H = num_heads, M = feature dimension of φ, E = value dimension.

A per-head factor γ_h ∈ (0, 1] weighs key n at query m by γ^{|m − n|}:

    y_m = Σ_n γ^{|m−n|} φ(q_m)·φ(k_n) v_n / Σ_n γ^{|m−n|} φ(q_m)·φ(k_n)   (n ≤ m when causal)

The kernels take the decay as its natural log, λ_h = log γ_h ≤ 0 (``log_decay``, (H,)): a
learned γ = sigmoid(logit) is then λ = logsigmoid(logit), exact even for γ within 2⁻²⁴ of 1,
where sigmoid's float32 result is rounded to 1. Powers are only ever formed for lags inside a
chunk or whole numbers of chunks (γ^{lag} = e^{lag·λ}), never for an absolute position.

With key log scales (FAVOR+, :mod:`spe.ops.scaled`) a decay is a shift of the log scale: a
state S relative to e^c after position m − 1 is γ S = S relative to e^{c + λ} at position m.
So the sums are kept relative to the *decayed* running maximum
c_m = max(c_{m−1} + λ, a_m) = max_{n ≤ m} (a_n + (m − n) λ) (:func:`decayed_running_max`),
which keeps every factor e^{a_n + (m−n)λ − c_m} ≤ 1 and follows the keys that still weigh:
a huge key long forgotten does not hold the scale up and underflow the recent ones.
Kernels without key scales run the same sums with a_n = 0 (then c_m = 0 exactly).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spe.ops.feature_maps import split_key_features

__all__ = ["DECAY_MODES", "FLOOR_LOG_SCALE", "NO_DECAY", "check_log_decay", "check_decay_mode", "decay_attention_reference", "decayed_running_max",
           "retnet_decay_logits", "retnet_log_decay"]

# The decays a model can ask for (ModelConfig.decay, --decay): none, RetNet's fixed γ_h,
# γ_h = sigmoid(logit_h) learned from RetNet's values, or a forget gate from the layer's input
# (spe.ops.gates; spe.encodings.gates): per head and position, or per feature channel.
DECAY_MODES = ("none", "fixed", "learned", "gated", "gated-channel")
NO_DECAY = DECAY_MODES[0]  # a name of its own: "none" is also a positional encoding's


def check_decay_mode(decay: str) -> None:
    """Raises ValueError unless ``decay`` is one of :data:`DECAY_MODES`."""
    if decay not in DECAY_MODES:
        raise ValueError(f"decay must be one of {', '.join(DECAY_MODES)}, got {decay!r}")


# Log scale given to keys that hold nothing (padding, the zero key that pads a shifted
# sequence) in decayed sums: finite, so that e^{c_n − c_m} never meets −∞ − (−∞), and far
# below any real key's scale (FAVOR+ scales are O(100) nats), so it is never the maximum
# while a real key is in reach.
FLOOR_LOG_SCALE = -1e30


def retnet_log_decay(num_heads: int, *, dtype: torch.dtype = torch.float32,
                     device: torch.device | str | None = None) -> Tensor:
    """log γ_h for RetNet's fixed decays γ_h = 1 − 2^(−5−h), h = 0 … H − 1 (Sun et al. 2023,
    §2.2); (H,), computed in float64 (log1p) then cast.

    Raises:
        ValueError: if ``num_heads`` is not a positive int.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    h = torch.arange(num_heads, dtype=torch.float64)
    return torch.log1p(-torch.exp2(-5.0 - h)).to(dtype=dtype, device=device)


def retnet_decay_logits(num_heads: int) -> Tensor:
    """logit(γ_h) = log(2^{5+h} − 1) of RetNet's decays (H,) float32: the initial value of a
    learned decay γ = sigmoid(logit)."""
    h = torch.arange(num_heads, dtype=torch.float64)
    return torch.log(torch.exp2(5.0 + h) - 1.0).float()


def check_log_decay(log_decay: Tensor, num_heads: int) -> None:
    """Validates λ = log γ: a floating (H,) tensor with finite values ≤ 0 (γ ∈ (0, 1]).

    Raises:
        ValueError: naming the shape, dtype or values received.
    """
    if not isinstance(log_decay, Tensor) or not log_decay.is_floating_point() or log_decay.shape != (num_heads,):
        got = f"{log_decay.dtype} {tuple(log_decay.shape)}" if isinstance(log_decay, Tensor) else type(log_decay)
        raise ValueError(f"log_decay must be a floating ({num_heads},) tensor of log γ per head, got {got}")
    bad = ~torch.isfinite(log_decay) | (log_decay > 0)
    if bool(bad.any()):
        raise ValueError(f"log_decay holds log γ, finite and ≤ 0 (γ in (0, 1]), got {log_decay.tolist()}")


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


def _keep(n: int, device, *, causal: bool, window: int | None, key_padding_mask: Tensor | None) -> Tensor:
    """The causal, window and padding masks over (query m, key n): (B or 1, 1, L, L) bool."""
    pos = torch.arange(n, device=device)
    lag = pos[:, None] - pos[None, :]
    keep = torch.ones(n, n, dtype=torch.bool, device=device)
    if causal:
        keep &= lag >= 0
    if window is not None:
        keep &= lag < window
    keep = keep[None, None]
    if key_padding_mask is not None:
        keep = keep & ~key_padding_mask[:, None, None, :]
    return keep


def _lag_weights(n: int, log_decay: Tensor, *, causal: bool, window: int | None,
                 key_padding_mask: Tensor | None) -> Tensor:
    """γ^{|m − n|} with the causal, window and padding masks: (B or 1, H, L, L)."""
    pos = torch.arange(n, device=log_decay.device)
    lag = pos[:, None] - pos[None, :]
    w = torch.exp(lag.abs().to(log_decay)[None] * log_decay[:, None, None])[None]
    return w * _keep(n, log_decay.device, causal=causal, window=window, key_padding_mask=key_padding_mask)


def _gate_weights(gates: Tensor, *, causal: bool, window: int | None, key_padding_mask: Tensor | None) -> Tensor:
    """exp(F_m − F_n) (n ≤ m), exp(F_n − F_m) (n > m), F the running sums of the gates (B, L, H)
    or (B, L, H, M), with the causal, window and padding masks: (B, H, L, L, G)."""
    g = gates if gates.dim() == 4 else gates[..., None]
    f = torch.cumsum(g, dim=1).permute(0, 2, 1, 3)  # (B, H, L, G)
    diff = f[:, :, :, None] - f[:, :, None, :]  # F_m − F_n
    pos = torch.arange(g.shape[1], device=g.device)
    later = (pos[:, None] >= pos[None, :])[..., None]  # n ≤ m
    keep = _keep(g.shape[1], g.device, causal=causal, window=window, key_padding_mask=key_padding_mask)
    return torch.exp(torch.where(later, diff, -diff)) * keep[..., None]


def decay_attention_reference(phi_q: Tensor, phi_k: Tensor, v: Tensor, log_decay: Tensor, *, causal: bool = True,
                              window: int | None = None, normalizer: tuple[Tensor, Tensor] | None = None,
                              key_log_scale: Tensor | None = None,
                              key_padding_mask: Tensor | None = None) -> Tensor:
    """The explicit O(L²) sum, in float64: y_m = Σ_n w_mn φ(q_m)·φ(k_n) v_n / Σ_n w_mn ψ(q_m)·ψ(k_n)
    with w_mn = γ^{|m−n|} (n ≤ m when causal, m − n < W with a window, n not padding).
    With a gate (:mod:`spe.ops.gates`) w_mn = exp(F_m − F_n) for n ≤ m, F_t = Σ_{s≤t} G_s
    (per feature channel for a channel gate, inside the dot products), and exp(F_n − F_m) for
    n > m without ``causal`` (the gates of the positions between, as for γ^{|m−n|}).
    For tests; memory O(B·H·L²) (O(B·H·L²·M) with a channel gate).

    Args:
        phi_q, phi_k: (B, L, H, M); v: (B, L, H, E); log_decay: (H,) λ = log γ, or a gate
            (B, L, H) or (B, L, H, M).
        causal, window: as :func:`~spe.ops.linear.causal_linear_attention`.
        normalizer: (ψ(q), ψ(k)) (B, L, H, M') for the denominator, or None (ψ = φ).
        key_log_scale: (B, L, H) a_n, φ(k_n) = phi_k_n · e^{a_n} (taken relative to the
            largest a_n of each example and head; keep them within ±700 nats); None when
            ``phi_k`` is :class:`~spe.ops.feature_maps.ScaledFeatures`, which carries it.
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
    if lam.dim() == 1:
        w = _lag_weights(phi_q.shape[1], lam, causal=causal, window=window, key_padding_mask=key_padding_mask)
        num = torch.einsum("bmhd,bnhd,bhmn,bnhe->bmhe", phi_q, phi_k, w, v)
        den = torch.einsum("bmhd,bnhd,bhmn->bmh", nq, nk, w)[..., None]
    else:
        w = _gate_weights(lam, causal=causal, window=window, key_padding_mask=key_padding_mask)
        num = torch.einsum("bmhd,bnhd,bhmnd,bnhe->bmhe", phi_q, phi_k, w.expand(*w.shape[:4], phi_q.shape[-1]), v)
        den = torch.einsum("bmhd,bnhd,bhmnd->bmh", nq, nk, w.expand(*w.shape[:4], nq.shape[-1]))[..., None]
    nonzero = den != 0
    return torch.where(nonzero, num / torch.where(nonzero, den, torch.ones_like(den)), torch.zeros_like(num))


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
    from spe.ops.chunked import causal_sums  # chunked → scaled; decay sits beside them

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

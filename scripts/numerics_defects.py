"""Measures issue 12's numerical defects 1-3 and 6 with the public kernels (before/after figures).

Run: PYTHONPATH=src python scripts/numerics_defects.py
Works on the code before the fixes too (then without ``favor_key_features``: the attention
layer's path at the time).
"""

from __future__ import annotations

import math

import torch

from spe.ops import causal_linear_attention, favor_feature_map, linear_attention, orthogonal_random_features

try:  # after the fixes: the attention layer's FAVOR+ keys come with their log scale
    from spe.ops import favor_key_features
except ImportError:
    favor_key_features = None


def key_features(k, w) -> tuple:
    """(key features, kernel keyword arguments) as the attention layer forms them."""
    if favor_key_features is None:
        return favor_feature_map(k, w, is_query=False), {}
    keys = favor_key_features(k, w)  # ScaledFeatures now, a (features, log_scale) tuple before
    fk, log_scale = (keys.features, keys.log_scale) if hasattr(keys, "features") else keys
    return fk, {"key_log_scale": log_scale}


def sharp_qk(spread: float, n: int = 256, h: int = 2, e: int = 32, seed: int = 0):
    """Queries/keys whose q·k/√E has standard deviation ≈ ``spread``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, n, h, e, generator=g)
    k = torch.randn(1, n, h, e, generator=g)
    scale = math.sqrt(spread)  # q·k/√E of unit Gaussians has std 1; scale both by √spread
    return q * scale, k * scale


def defect1(spread: float) -> dict:
    q, k = sharp_qk(spread)
    w = orthogonal_random_features(2, 64, 32, generator=torch.Generator().manual_seed(1))
    fq, (fk, kw) = favor_feature_map(q, w, is_query=True), key_features(k, w)
    ones = torch.ones(1, q.shape[1], 2, 8)
    causal = causal_linear_attention(fq, fk, ones, **kw)
    full = linear_attention(fq, fk, ones, **kw)
    windowed = causal_linear_attention(fq, fk, ones, window=40, chunk_size=16, **kw)
    return {"causal_min": causal.min().item(), "causal_below_0.99": (causal < 0.99).float().mean().item(),
            "noncausal_min": full.min().item(), "windowed_min": windowed.min().item(),
            "position0": causal[0, 0].min().item()}


def defect2(window: int, n: int | None = None, chunk: int = 64) -> float:
    n = n or window + 1024
    g = torch.Generator().manual_seed(0)
    fq = torch.rand(1, n, 1, 4, generator=g, dtype=torch.float64) + 0.1
    fk = torch.rand(1, n, 1, 4, generator=g, dtype=torch.float64) + 0.1
    v = torch.randn(1, n, 1, 2, generator=g, dtype=torch.float64)
    fk[0, 3] = 1e9  # one adversarial early key
    exact = causal_linear_attention(fq, fk, v, window=window, chunk_size=chunk)
    single = causal_linear_attention(fq.float(), fk.float(), v.float(), window=window, chunk_size=chunk)
    return ((single.double() - exact).abs().max() / exact.abs().max()).item()


def defect3() -> float:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, 2, 32, generator=g)
    w = orthogonal_random_features(2, 64, 32, generator=g)
    ref = favor_feature_map(x, w, is_query=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = favor_feature_map(x, w, is_query=False)
    return ((low.float() - ref).abs() / ref.abs()).max().item()


def defect6(e: int = 256, n: int = 4096, value: float = 1e7) -> dict:
    """Keys aligned with the longest random feature (exponent ‖ω_j‖²/2 ≈ 157 at test-time R = E = 256):
    n equal ones with values ``value`` (exact output: ``value``), and the pair (weaker key 0.7·ω_j with
    value 0, then ω_j with value 1) whose exact output at the second position is ≈ 1."""
    w = orthogonal_random_features(1, 64, e, generator=torch.Generator().manual_seed(0))
    j = w[0].norm(dim=-1).argmax()
    key = (w[0, j] * e ** 0.25).view(1, 1, 1, e).expand(1, n, 1, e).contiguous()
    fk, kw = key_features(key, w)
    y = causal_linear_attention(favor_feature_map(key, w, is_query=True), fk, torch.full((1, n, 1, 2), value), **kw)
    pair = torch.stack([w[0, j] * 0.7, w[0, j]]).view(1, 2, 1, e) * e ** 0.25
    fk, kw = key_features(pair, w)
    y2 = causal_linear_attention(favor_feature_map(pair, w, is_query=True, eps=0.0), fk,
                                 torch.tensor([0.0, 1.0]).view(1, 2, 1, 1), **kw)
    return {"max_exponent": (w[0, j].norm() ** 2 / 2).item(), "n_equal_keys_finite": bool(torch.isfinite(y).all()),
            "n_equal_keys_max_rel_error": ((y - value).abs().max() / value).item(), "pair_output": y2[0, 1, 0, 0].item()}


def large_r(e: int) -> float:
    """Max error vs float64 of FAVOR+ causal attention for ordinary keys (‖x'‖ = 1) at R = E."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 64, 1, e, generator=g)
    x = x / x.norm(dim=-1, keepdim=True) * e ** 0.25
    v = torch.randn(1, 64, 1, 3, generator=g)
    w = orthogonal_random_features(1, 64, e, generator=g)
    fk, kw = key_features(x, w)
    y = causal_linear_attention(favor_feature_map(x, w, is_query=True, eps=0.0), fk, v, **kw)
    xd = x.double() / e ** 0.25
    f = torch.exp(torch.einsum("blhe,hme->blhm", xd, w.double()) - 0.5 * (xd ** 2).sum(-1, keepdim=True))
    a = torch.einsum("bmhf,bnhf->bhmn", f, f).tril()
    exact = torch.einsum("bhmn,bnhe->bmhe", a, v.double()) / a.sum(-1).transpose(1, 2)[..., None]
    return (y.double() - exact).abs().max().item()


if __name__ == "__main__":
    for spread in (4.0, 6.0):
        print(f"defect 1, spread {spread}:", defect1(spread))
    for window in (2048, 2560, 16384):
        print(f"defect 2, W = {window}: max relative error float32 vs float64 = {defect2(window):.3g}")
    print(f"defect 3: max relative error of bf16-autocast key features = {defect3():.3g}")
    print("defect 6:", defect6())
    for e in (256, 1024):
        print(f"defect 6, ordinary keys at R = {e}: max error vs float64 = {large_r(e):.3g}")

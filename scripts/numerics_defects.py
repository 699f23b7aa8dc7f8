"""Measures issue 12's numerical defects 1-3 and 6 with the public kernels (before/after figures).

Run: PYTHONPATH=src python scripts/numerics_defects.py
"""

from __future__ import annotations

import math

import torch

from spe.ops import causal_linear_attention, favor_feature_map, linear_attention, orthogonal_random_features


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
    fq, fk = favor_feature_map(q, w, is_query=True), favor_feature_map(k, w, is_query=False)
    ones = torch.ones(1, q.shape[1], 2, 8)
    causal = causal_linear_attention(fq, fk, ones)
    full = linear_attention(fq, fk, ones)
    windowed = causal_linear_attention(fq, fk, ones, window=40, chunk_size=16)
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


def defect6(e: int = 256, n: int = 4096) -> dict:
    """A key aligned with a random feature of large norm (test-time R = E)."""
    w = orthogonal_random_features(1, 64, e, generator=torch.Generator().manual_seed(0))
    j = w[0].norm(dim=-1).argmax()
    key = (w[0, j] * e ** 0.25).view(1, 1, 1, e).expand(1, n, 1, e).contiguous()
    fk = favor_feature_map(key, w, is_query=False)
    fq = favor_feature_map(key, w, is_query=True)
    y = causal_linear_attention(fq, fk, torch.ones(1, n, 1, 2))
    return {"max_logit": (w[0, j].norm() ** 2 / 2).item(), "finite": bool(torch.isfinite(y).all()),
            "last": y[0, -1, 0, 0].item()}


if __name__ == "__main__":
    for spread in (4.0, 6.0):
        print(f"defect 1, spread {spread}:", defect1(spread))
    for window in (2048, 2560, 16384):
        print(f"defect 2, W = {window}: max relative error float32 vs float64 = {defect2(window):.3g}")
    print(f"defect 3: max relative error of bf16-autocast key features = {defect3():.3g}")
    print("defect 6:", defect6())

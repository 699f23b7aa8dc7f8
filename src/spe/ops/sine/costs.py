"""The cost model of applying a sineSPE code: which implementation ``impl="auto"`` picks.

Letters: B = batch, L = length, H = num_heads, D = head_dim, K = num_sines (J = 2K),
R = num_realizations, U = L·H·D·R.

The implementations are :func:`spe.ops.sine.apply.apply_code` on a materialised code, and
the blocked products (``fused``, :mod:`spe.ops.sine.fused`: one GEMM of inner size D·2K
per example; ``blocked``, :mod:`spe.ops.sine.blocked`: each block's code formed once for the
batch). The constants were
measured; docs/bench.md says where and how they hold up on other machines.
"""

from __future__ import annotations

import torch

__all__ = ["BLOCKED_EFFICIENCY", "BLOCK_ELEMENTS", "MATERIALIZE_LIMIT", "block_budget", "choose_sine_impl",
           "sine_costs"]

# Above this many elements of Q̄ (L·H·D·R), "auto" does not materialise sineSPE codes
# (64 MiB per code tensor in float32).
MATERIALIZE_LIMIT = 1 << 24
# Relative speed per multiply-add of the batch-shared products against the fused GEMM
# (inner size D·2K), from forward+backward timings on the development CPU (one thread beside
# one training; H = 8, D = 64, K = 5, R = 64, N = 2,048) after the fused product stopped
# evaluating sin and cos per position: B = 3, 4, 6, 8 give 0.37, 0.36, 0.35, 0.33 (equal times
# near B = 6). Before that change the fused product was 1.8× slower and this was 0.65.
BLOCKED_EFFICIENCY = 0.35
# Elements of one block of each blocked product, (on a CPU, elsewhere). On a CPU, sized for its
# caches. On a GPU the CPU's blocks leave each product launch-bound (a learned-time model step
# at 30× APE's time on an H100, one layer with the fused index product at 19-57×), and a GPU
# holds one block's temporaries at the budgets below easily (up to about 1 GiB: the timed
# product's float64 phases alone are 512 MiB at 2²⁶ features); the GPU budgets are the best of
# 1, 16, 64 and 256 times the CPU's on an H100 (tools/analysis/block_scale.py;
# docs/bench/h100.md, 2026-11-27): fused and batch-shared at 64×, timed at 256×. Units: fused, B·l·H·D·2K
# products; blocked, l·H·D·R code elements; timed, H·l·K·D features (l positions of a block).
BLOCK_ELEMENTS = {"fused": (1 << 20, 1 << 26), "blocked": (1 << 21, 1 << 27), "timed": (1 << 18, 1 << 26)}


def block_budget(product: str, device: torch.device) -> int:
    """The elements of one block of a blocked sineSPE product on ``device``.

    Args:
        product: ``fused``, ``blocked`` or ``timed`` (a key of :data:`BLOCK_ELEMENTS`).
        device: where the product runs; a CPU gets the first budget, any other device the second.

    Raises:
        KeyError: for another product.
    """
    cpu, other = BLOCK_ELEMENTS[product]
    return cpu if device.type == "cpu" else other


def sine_costs(batch: int, length: int, num_heads: int, head_dim: int, num_sines: int,
               num_realizations: int) -> dict[str, tuple[float, float]]:
    """Cost model of applying one sineSPE code to queries or keys, forward+backward.

    Returns, per implementation, (multiply-adds, extra elements held) with U = L·H·D·R:

    * ``materialized``: code 2K·U, applied B·U forward and 2·B·U backward, gradient of W 2K·U;
      holds the code and its gradient, 2·U (shared by every layer that shares the code).
    * ``fused``: 3·B·2K·U (forward, gradients of W and of x·Ω); holds one block.
    * ``blocked``: code formed twice (forward, backward) 2·2K·U, gradients of W and Ω 2·2K·U,
      applied 3·B·U; holds one block.
    """
    u = float(length) * num_heads * head_dim * num_realizations
    j = 2 * num_sines
    return {"materialized": ((2 * j + 3 * batch) * u, 2 * u),
            "fused": (3 * batch * j * u, 0.0),
            "blocked": ((4 * j + 3 * batch) * u, 0.0)}


def choose_sine_impl(batch: int, length: int, num_heads: int, head_dim: int, num_sines: int,
                     num_realizations: int) -> str:
    """What ``impl="auto"`` applies: ``materialized``, ``fused`` or ``blocked``.

    Materialised while the code has at most ``MATERIALIZE_LIMIT`` elements (cheapest in time:
    formed once and shared by the layers); beyond that, the blocked or fused form, whichever
    has the smaller multiply-add count of :func:`sine_costs` after dividing the blocked
    count's rate by ``BLOCKED_EFFICIENCY`` (its products have inner sizes 2K and D instead of
    one D·2K GEMM). Both hold only one block, so memory does not decide between them.

    With K = 5 this gives the fused form for B ≤ 5 and the blocked one from B = 6 (the
    blocked form has more multiply-adds than the fused one at B = 1 for any K).
    """
    costs = sine_costs(batch, length, num_heads, head_dim, num_sines, num_realizations)
    if costs["materialized"][1] / 2 <= MATERIALIZE_LIMIT:
        return "materialized"
    return "blocked" if costs["blocked"][0] / BLOCKED_EFFICIENCY < costs["fused"][0] else "fused"

"""The blocked sineSPE products equal their reference twin forward and backward (float64),
whatever the blocks, and pass gradcheck."""

import math

import pytest
import torch

from spe.ops.sine import FusedSineProduct, SharedSineProduct, sine_product_reference


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 7, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    freqs = (0.2 * torch.rand(2, 3, 2, generator=g, dtype=torch.float64)).requires_grad_()
    phases = torch.randn(2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([0.0, 1.0, 2.5, 3.0, 10.0, 11.0, 300.0], dtype=torch.float64)
    w = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)  # (H, D, 2K, R)
    return x, freqs, phases, positions, w


def _apply(product, x, freqs, phases, positions, w, block):
    if product == "fused":  # W as (H, D·2K, R)
        return FusedSineProduct.apply(x, freqs, phases, positions, w.reshape(w.shape[0], -1, w.shape[-1]), block)
    return SharedSineProduct.apply(x, freqs, phases, positions, w, block)


@pytest.mark.parametrize("product", ["fused", "shared"])
@pytest.mark.parametrize("with_phases", [True, False])
@pytest.mark.parametrize("block", [1, 3, 7, 100])
def test_products_equal_the_reference_forward_and_backward(product, with_phases, block):
    x, freqs, phases, positions, w = _inputs()
    phases = phases if with_phases else None
    leaves = [t for t in (x, freqs, phases, w) if t is not None]
    weights = torch.linspace(-1, 1, 2 * 7 * 2 * 5, dtype=torch.float64).view(2, 7, 2, 5)
    results = []
    for fn in (lambda: _apply(product, x, freqs, phases, positions, w, block),
               lambda: sine_product_reference(x, freqs, phases, positions, w)):
        y = fn()
        results.append([y, *torch.autograd.grad((y * weights).sum(), leaves)])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("product", ["fused", "shared"])
def test_blocked_products_pass_gradcheck_with_uneven_blocks(product):
    x, freqs, phases, positions, w = _inputs()
    if product == "fused":
        fn, w = FusedSineProduct.apply, w.detach().reshape(2, 12, 5).requires_grad_()
    else:
        fn = SharedSineProduct.apply
    for block in (1, 3, 7, 100):
        assert torch.autograd.gradcheck(lambda a, f, t, c: fn(a, f, t, positions, c, block), (x, freqs, phases, w))
        assert torch.autograd.gradcheck(lambda a, f, c: fn(a, f, None, positions, c, block), (x, freqs, w))
        # only some inputs need a gradient (frozen codes, or frozen queries): the others' are skipped
        assert torch.autograd.gradcheck(lambda a: fn(a, freqs.detach(), phases.detach(), positions, w.detach(), block),
                                        (x,))
        assert torch.autograd.gradcheck(lambda f, c: fn(x.detach(), f, None, positions, c, block), (freqs, w))


def _far_inputs(dtype, n=40, start=1_000_003):
    g = torch.Generator().manual_seed(1)
    x = 30 * torch.randn(2, n, 2, 3, generator=g, dtype=torch.float64)  # large norms
    freqs = 0.5 * torch.rand(2, 3, 2, generator=g, dtype=torch.float64)
    phases = torch.randn(2, 3, 2, generator=g, dtype=torch.float64)
    w = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
    # the same float32 values in both dtypes: f rounded to float32 moves the phase at 10^6 by 0.1 rad
    leaves = [t.float().to(dtype).requires_grad_() for t in (x, freqs, phases, w)]
    return leaves, start + torch.arange(n)


@pytest.mark.parametrize("product", ["fused", "shared"])
def test_float32_products_at_far_positions_match_float64_within_the_rounding_bound(product):
    """Consecutive positions near 10^6, blocks of 7 (the last one shorter): the float32 product
    and its gradients equal the float64 reference within γ·Σ|terms| (a float32 sum of
    D·2K terms of a few roundings each, with the phases reduced in float64)."""
    (x, f, th, w), positions = _far_inputs(torch.float32)
    (x64, f64, th64, w64), _ = _far_inputs(torch.float64)
    weights = torch.randn(2, 40, 2, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    y = _apply(product, x, f, th, positions, w, 7)
    grads = torch.autograd.grad((y.double() * weights).sum(), [x, f, th, w])
    # the test's own float64 twin (not sine_phase): f·n is exact in float64 for these values
    angle = 2 * math.pi * torch.remainder(f64.detach()[None] * positions.double()[:, None, None, None], 1.0)
    angle = angle + 2 * math.pi * (f64 - f64.detach())[None] * positions.double()[:, None, None, None] + th64
    omega = torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1).flatten(-2)  # (L, H, D, 2K)
    y64 = torch.einsum("blhd,lhdj,hdjr->blhr", x64, omega, w64)
    grads64 = torch.autograd.grad((y64 * weights).sum(), [x64, f64, th64, w64])
    bound = torch.einsum("blhd,lhdj,hdjr->blhr", x64.detach().abs(), omega.detach().abs(), w64.detach().abs())
    eps32 = torch.finfo(torch.float32).eps
    assert ((y.double() - y64).abs() <= 16 * eps32 * bound).all()
    # each gradient element is a sum of terms |weights|·|x|·|Ω or ∂Ω/∂angle|·|W| (×2π|n| for f);
    # |Ω|, |∂Ω/∂angle| ≤ 1, so the gradients of S = Σ |weights| Σ |x|·A·|W| at A = 1 bound each
    # element's absolute term sum (for f and θ through A, summed over the pair and positions)
    ax, aw = x64.detach().abs().requires_grad_(), w64.detach().abs().requires_grad_()
    a = torch.ones_like(omega).requires_grad_()
    total = (weights.abs() * torch.einsum("blhd,lhdj,hdjr->blhr", ax, a, aw)).sum()
    sx, sa, sw = torch.autograd.grad(total, [ax, a, aw])
    sa = sa.view(*sa.shape[:-1], -1, 2).sum(-1)  # (L, H, D, K)
    sth = sa.sum(0)
    sf = 2 * math.pi * torch.einsum("lhdk,l->hdk", sa, positions.double().abs())
    for got, exact, terms in zip(grads, grads64, (sx, sf, sth, sw), strict=True):
        assert ((got.double() - exact).abs() <= 64 * eps32 * terms).all()


@pytest.mark.parametrize("product", ["fused", "shared"])
def test_products_evaluate_sin_and_cos_once_per_call_for_consecutive_positions(product, monkeypatch):
    """The blocks of consecutive positions share one table of offsets (the shorter last block
    reads a prefix of it): sine_features runs once in forward and once in backward, whatever
    the number of blocks; scattered positions need a table whenever a block's offsets differ
    from the previous block's."""
    import spe.ops.sine.recompute as recompute

    calls = []
    real = recompute.sine_features

    def counting(*args):
        calls.append(args[1].shape[0])
        return real(*args)

    monkeypatch.setattr(recompute, "sine_features", counting)
    (x, f, th, w), positions = _far_inputs(torch.float64)
    y = _apply(product, x, f, th, positions, w, 7)  # 6 blocks, the last of 5
    assert calls == [7]
    y.sum().backward()
    assert calls == [7, 7]
    calls.clear()
    x, f, th, scattered, w = _inputs()
    _apply(product, x, f, th, scattered, w, 2)
    # blocks (0, 1), (2.5, 3), (10, 11), (300): offsets (0, 1), (0, 0.5), (0, 1) each differ
    # from the block before; the last one's (0) is a prefix of the one before
    assert calls == [2, 2, 2]

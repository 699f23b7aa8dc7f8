"""The blocked sineSPE products equal their reference twin forward and backward (float64),
whatever the blocks, and pass gradcheck."""

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

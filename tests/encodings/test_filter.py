"""SPE filter: eq. (16)-(17) scale, gating, fused/materialised/reference agree forward and backward."""

import math

import pytest
import torch

from spe import ConvSPE, SineSPE, SPEFilter


def _setup(gated=True, h=2, d=6, r=5, k=3, seed=0):
    torch.manual_seed(seed)
    enc = SineSPE(h, d, num_realizations=r, num_sines=k).double()
    with torch.no_grad():
        enc.phases.uniform_(-math.pi, math.pi)
        enc.gains.normal_()
    filt = SPEFilter(h, d, gated=gated).double()
    if gated:
        with torch.no_grad():
            filt.gate_logits.normal_()
    return enc, filt


@pytest.mark.parametrize("gated", [True, False])
def test_fused_and_materialized_equal_reference_forward_and_backward(gated):
    enc, filt = _setup(gated)
    q = torch.randn(3, 9, 2, 6, dtype=torch.float64, requires_grad=True)
    k = torch.randn(3, 4, 2, 6, dtype=torch.float64, requires_grad=True)  # different key length
    results = {}
    for impl in ("reference", "materialized", "fused"):
        filt.impl = impl
        enc.zero_grad()
        filt.zero_grad()
        q.grad = k.grad = None
        code = enc(query_positions=torch.arange(9), key_positions=torch.arange(5, 9),
                   generator=torch.Generator().manual_seed(1))
        qh, kh = filt(q, k, code)
        assert qh.shape == (3, 9, 2, 5) and kh.shape == (3, 4, 2, 5)
        loss = (qh.sin() * torch.arange(5.0, dtype=torch.float64)).sum() + (kh**2).sum()
        loss.backward()
        grads = [q.grad, k.grad, enc.frequency_logits.grad, enc.phases.grad, enc.gains.grad]
        if gated:
            grads.append(filt.gate_logits.grad)
        results[impl] = [qh, kh] + [g.clone() for g in grads]
    for impl in ("materialized", "fused"):
        for a, b in zip(results[impl], results["reference"]):
            torch.testing.assert_close(a, b)


def test_score_scale_makes_exponent_an_unbiased_estimate_of_eq_8():
    # E[q̂·k̂ / √R] = Σ_d q_d P_d(m−n) k_d / √D: average many independent draws.
    enc, filt = _setup(gated=False, h=1, d=4, r=16)
    q = torch.randn(1, 1, 1, 4, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 4, dtype=torch.float64)
    draws = []
    for s in range(2000):
        code = enc(query_positions=torch.tensor([7]), key_positions=torch.tensor([3]),
                   generator=torch.Generator().manual_seed(s))
        with torch.no_grad():
            qh, kh = filt(q, k, code)
        draws.append(float((qh * kh).sum()) / math.sqrt(16))
    draws = torch.tensor(draws, dtype=torch.float64)
    target = float((q[0, 0, 0] * enc.kernel(torch.tensor([4]))[0, :, 0] * k[0, 0, 0]).sum()) / 2
    assert abs(draws.mean() - target) < 4 * draws.std() / math.sqrt(len(draws))


def test_gate_one_removes_positional_dependence():
    for enc in (SineSPE(2, 4, 8, 3), ConvSPE(2, 4, 8, 5)):
        filt = SPEFilter(2, 4, gated=True, gate_init=40.0)  # δ = 1 − 4e-18
        x = torch.randn(1, 1, 2, 4).expand(1, 30, 2, 4)  # the same vector at every position
        qh, kh = filt(x, x, enc(30, generator=torch.Generator().manual_seed(0)))
        scores = torch.einsum("bmhr,bnhr->bhmn", qh, kh)
        torch.testing.assert_close(scores, scores[..., :1, :1].expand_as(scores))
        # ...while with δ = 0.5 the scores do depend on the positions.
        qh, kh = SPEFilter(2, 4, gate_init=0.0)(x, x, enc(30, generator=torch.Generator().manual_seed(0)))
        scores = torch.einsum("bmhr,bnhr->bhmn", qh, kh)
        assert (scores - scores[..., :1, :1]).abs().max() > 1e-3


def test_shape_errors_name_the_shapes():
    enc, filt = _setup()
    code = enc(5)
    with pytest.raises(ValueError, match=r"\(2, 5, 2, 7\)"):
        filt(torch.zeros(2, 5, 2, 7, dtype=torch.float64), torch.zeros(2, 5, 2, 6, dtype=torch.float64), code)
    with pytest.raises(ValueError, match="impl"):
        SPEFilter(2, 6, impl="magic")


def test_blocked_fused_product_passes_gradcheck_with_uneven_blocks():
    from spe.encodings.filter import _FusedSineProduct

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    freqs = (0.2 * torch.rand(2, 3, 2, generator=g, dtype=torch.float64)).requires_grad_()
    phases = torch.randn(2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([0.0, 1.0, 2.5, 3.0, 10.0, 11.0, 300.0], dtype=torch.float64)
    w = torch.randn(2, 12, 5, generator=g, dtype=torch.float64, requires_grad=True)
    for block in (1, 3, 7, 100):
        assert torch.autograd.gradcheck(
            lambda a, f, t, c: _FusedSineProduct.apply(a, f, t, positions, c, block), (x, freqs, phases, w))
        assert torch.autograd.gradcheck(
            lambda a, f, c: _FusedSineProduct.apply(a, f, None, positions, c, block), (x, freqs, w))

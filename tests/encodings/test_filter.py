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
    for impl in ("reference", "materialized", "fused", "blocked"):
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
    for impl in ("materialized", "fused", "blocked"):
        for a, b in zip(results[impl], results["reference"]):
            torch.testing.assert_close(a, b)


@pytest.mark.slow
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
        qh, kh = SPEFilter(2, 4, gated=True, gate_init=0.0)(x, x, enc(30, generator=torch.Generator().manual_seed(0)))
        scores = torch.einsum("bmhr,bnhr->bhmn", qh, kh)
        assert (scores - scores[..., :1, :1]).abs().max() > 1e-3


def test_shape_errors_name_the_shapes():
    enc, filt = _setup()
    code = enc(5)
    with pytest.raises(ValueError, match=r"\(2, 5, 2, 7\)"):
        filt(torch.zeros(2, 5, 2, 7, dtype=torch.float64), torch.zeros(2, 5, 2, 6, dtype=torch.float64), code)
    with pytest.raises(ValueError, match="impl"):
        SPEFilter(2, 6, impl="magic")


def _gated_kernel_z_scores(enc, filt, lags, key_position, r, seed):
    """Standardised errors of the gated code's kernel estimate, read through the filter.

    With one-hot queries/keys x = e_d, q̂ = Q̃_d / (DR)^{1/4} where Q̃_d = √(1−δ_d) Q̄_d + √δ_d ε_d
    (eq. 23-25), so ê_d = Σ_r q̂ k̂ · √D / √R = (1/R) Σ_r Q̃_d(m, r) K̃_d(n, r). Each product is
    (u·W_r)(v·W_r) for i.i.d. standard W_r = (Z_r, ε_r), with u·v = (1−δ)P(m−n) + δ: ê is
    unbiased for that and has variance ((u·u)(v·v) + (u·v)²) / R, where u·u = (1−δ)A + δ and
    v·v = (1−δ)B + δ with A = E[Q̄_d²]/R, B = E[K̄_d²]/R.
    """
    h, d = enc.num_heads, enc.head_dim
    eye = torch.eye(d, dtype=torch.float64)  # batch b holds feature b
    q = eye[:, None, None, :].expand(d, len(lags), h, d)
    k = eye[:, None, None, :].expand(d, 1, h, d)
    code = enc(query_positions=key_position + torch.tensor(lags), key_positions=torch.tensor([key_position]),
               num_realizations=r, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        qh, kh = filt(q, k, code)  # (D, T, H, R), (D, 1, H, R)
    est = torch.einsum("dthr,dhr->hdt", qh, kh[:, 0]) * math.sqrt(d / r)  # (H, D, T)
    delta = filt.gate.detach()[..., None]
    mean = (1 - delta) * enc.kernel(torch.tensor(lags)).detach() + delta
    if isinstance(enc, SineSPE):
        a = b = (enc.gains.detach() ** 2).sum(-1) / (2 * enc.num_sines)  # Σ_k λ² (cos² + sin²) / 2K
    else:
        a, b = enc.filters_q.detach().pow(2).sum(-1), enc.filters_k.detach().pow(2).sum(-1)
    uu, vv = (1 - delta) * a[..., None] + delta, (1 - delta) * b[..., None] + delta
    return (est - mean) / torch.sqrt((uu * vv + mean**2) / r)


@pytest.mark.parametrize(("kind", "impl"), [("sine", "reference"), ("sine", "materialized"), ("sine", "fused"),
                                            ("sine", "blocked"), ("conv", "reference"), ("conv", "materialized")])
@pytest.mark.slow
def test_gated_kernel_monte_carlo_mean_is_mixture_at_rate_one_over_sqrt_r(kind, impl):
    # Replacing √(1−δ), √δ by (1−δ), δ in any path shifts the mean to
    # (1−δ)²P + δ² (≈ 0.5 away at δ = ½), i.e. z ≈ 3 at R = 64 and 11 at R = 1,024: red.
    torch.manual_seed(0)
    h, d = 4, 32
    if kind == "sine":
        enc = SineSPE(h, d, num_sines=3).double()
        with torch.no_grad():
            enc.phases.uniform_(-math.pi, math.pi)
            enc.gains.normal_()
            enc.frequency_logits.normal_(-2.0, 1.5)
    else:
        enc = ConvSPE(h, d, kernel_size=7).double()
        with torch.no_grad():
            enc.filters_q.normal_(0, 1 / math.sqrt(7))
            enc.filters_k.normal_(0, 1 / math.sqrt(7))
    filt = SPEFilter(h, d, gated=True, impl=impl).double()
    with torch.no_grad():
        filt.gate_logits.normal_()  # δ spread over (0, 1)
    lags = [0, 1, 3, -2, 6]
    n = h * d  # independent (head, feature) entries per lag: mean of n squared N(0, 1) has sd √(2/n)
    for r, seed in ((64, 1), (1024, 2)):  # the same standardisation at R and 16 R: error ∝ 1/√R
        z = _gated_kernel_z_scores(enc, filt, lags, 20, r, seed)
        msq = z.pow(2).mean(dim=(0, 1))
        assert torch.all((msq - 1).abs() < 4 * math.sqrt(2 / n)), (r, msq)


def test_auto_choice_follows_the_cost_model():
    from spe.ops.sine.costs import MATERIALIZE_LIMIT, choose_sine_impl, sine_costs

    h, d, k, r = 8, 64, 5, 64
    small = MATERIALIZE_LIMIT // (h * d * r)  # a code of exactly the limit
    assert choose_sine_impl(8, small, h, d, k, r) == "materialized"
    # Beyond it, batch 1: blocked forms the code twice and applies it, more work than fused.
    costs = sine_costs(1, 4096, h, d, k, r)
    assert costs["blocked"][0] > costs["fused"][0] and choose_sine_impl(1, 4096, h, d, k, r) == "fused"
    # A large batch shares the code: blocked needs (8K + 3B)/(6BK) of the work, under a fifth at B = 16.
    costs = sine_costs(16, 4096, h, d, k, r)
    assert costs["blocked"][0] < costs["fused"][0] / 5 and choose_sine_impl(16, 4096, h, d, k, r) == "blocked"
    assert costs["materialized"][1] == 2 * 4096 * h * d * r and costs["blocked"][1] == 0
    # the measured crossover (B = 3..8 at N = 2,048 timed fused faster up to about B = 5)
    assert [choose_sine_impl(b, 4096, h, d, k, r) for b in (2, 5, 6, 8)] == ["fused", "fused", "blocked", "blocked"]
    filt = SPEFilter(h, d)
    code = SineSPE(h, d, r, k)(4096)
    assert filt.resolve_impl(16, code) == "blocked" and SPEFilter(h, d, impl="fused").resolve_impl(16, code) == "fused"


@pytest.mark.parametrize("encoding", ["sine", "conv"])
def test_layers_sharing_a_materialised_code_save_no_copy_of_it_for_backward(encoding):
    # A model applies one code in every layer. If the code is a strided view, each layer's
    # product copies it and keeps the copy for backward (4 layers: 4 extra codes held).
    h, d, r, n = 2, 8, 4, 32
    enc = SineSPE(h, d, num_realizations=r, num_sines=3) if encoding == "sine" else ConvSPE(h, d, num_realizations=r,
                                                                                              kernel_size=5)
    code = enc(n, generator=torch.Generator().manual_seed(0))
    qbar, kbar = code.materialize()
    code_bytes = qbar.numel() * qbar.element_size()
    filters = [SPEFilter(h, d, gated=False, impl="materialized") for _ in range(3)]
    saved = []

    def pack(t):
        saved.append((t.untyped_storage().data_ptr(), t.numel() * t.element_size()))
        return t

    x = torch.randn(2, n, h, d, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for f in filters:
            f(x, x, code)
    big = {ptr for ptr, nbytes in saved if nbytes >= code_bytes}
    assert big == {qbar.untyped_storage().data_ptr(), kbar.untyped_storage().data_ptr()}

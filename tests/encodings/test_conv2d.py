"""2-D convSPE: FFT = direct (forward and backward), exact stationary kernel, Monte-Carlo rate, gradients."""

import math

import pytest
import torch

from spe.encodings.conv2d import ConvSPE2d, filter_noise_2d, filter_noise_2d_direct


def _encoding(p=(3, 4), h=2, d=16, seed=0, impl="auto"):
    torch.manual_seed(seed)
    enc = ConvSPE2d(h, d, num_realizations=8, kernel_size=p, impl=impl).double()
    with torch.no_grad():  # adversarial: no symmetry, signs mixed
        enc.filters_q.normal_(0, 1 / math.sqrt(p[0] * p[1]))
        enc.filters_k.normal_(0, 1 / math.sqrt(p[0] * p[1]))
    return enc


def test_fft_equals_direct_on_the_same_noise_forward_and_backward():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6 + 4, 5 + 2, 2, 3, 4, generator=g, dtype=torch.float64)  # grid 6 × 5, P = 5 × 3
    f = torch.randn(2, 3, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    fast, slow = filter_noise_2d(z, f), filter_noise_2d_direct(z, f)
    assert fast.shape == (30, 2, 3, 4)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-10)
    w = torch.randn(fast.shape, generator=g, dtype=torch.float64)
    gf, = torch.autograd.grad((fast * w).sum(), f)
    gs, = torch.autograd.grad((slow * w).sum(), f)
    torch.testing.assert_close(gf, gs, rtol=1e-10, atol=1e-10)
    # float32 FFT against the float64 reference.
    torch.testing.assert_close(filter_noise_2d(z.float(), f.detach().float()), slow.detach().float(),
                               rtol=1e-4, atol=1e-5)
    # Position (y, x) row-major sees Z[y : y + P1, x : x + P2] (the definition, by hand).
    y, x = 4, 3
    by_hand = (f.detach()[..., None] * z[y:y + 5, x:x + 3].permute(2, 3, 0, 1, 4)).sum((2, 3))
    torch.testing.assert_close(slow[y * 5 + x].detach(), by_hand)


@pytest.mark.slow
def test_module_impls_give_the_same_code_for_the_same_generator():
    a, b = _encoding(impl="fft"), _encoding(impl="direct")
    ca = a((5, 7), generator=torch.Generator().manual_seed(3))
    cb = b((5, 7), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(ca.qbar, cb.qbar)
    torch.testing.assert_close(ca.kbar, cb.kbar)
    assert ca.qbar.shape == (35, 2, 16, 8) and ca.gate_noise.shape == (2, 16, 8)


def test_expected_code_product_is_the_kernel_of_the_offset_exactly():
    """E[Q̄(m) K̄(n)] computed exactly (one-hot noise: realisation u is a unit impulse at u, so
    Σ_u Q̄_u(m) K̄_u(n) = Σ_u A_m(u) B_n(u)) equals kernel(m − n) for every pair: the expectation
    depends on the 2-D offset only (stationary, borders included) and vanishes beyond the filter."""
    enc = _encoding(p=(3, 4), h=1, d=2)
    grid, (p1, p2) = (5, 6), enc.kernel_size
    n_noise = (grid[0] + p1 - 1) * (grid[1] + p2 - 1)
    eye = torch.eye(n_noise, dtype=torch.float64).view(grid[0] + p1 - 1, grid[1] + p2 - 1, 1, 1, n_noise)
    z = eye.expand(-1, -1, 1, 2, -1)
    qbar, kbar = filter_noise_2d(z, enc.filters_q), filter_noise_2d(z, enc.filters_k)
    expected = torch.einsum("mhdu,nhdu->hdmn", qbar, kbar)  # (H, D, L, L)
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    pos = torch.stack([rows, cols], -1).view(-1, 2)  # (L, 2), row-major
    offsets = (pos[:, None] - pos[None]).view(-1, 2)
    exact = enc.kernel(offsets).view(1, 2, pos.shape[0], pos.shape[0])
    torch.testing.assert_close(expected.detach(), exact.detach())
    far = (offsets[:, 0].abs() >= p1) | (offsets[:, 1].abs() >= p2)
    assert torch.all(exact.flatten(2)[..., far] == 0) and torch.all(exact.flatten(2)[..., ~far] != 0)
    # kernel() by hand for one offset: Σ_a Φ^Q(a) Φ^K(a + τ).
    tau = (1, -2)
    by_hand = sum(enc.filters_q[0, 0, a, b] * enc.filters_k[0, 0, a + tau[0], b + tau[1]]
                  for a in range(p1) for b in range(p2) if 0 <= a + tau[0] < p1 and 0 <= b + tau[1] < p2)
    torch.testing.assert_close(enc.kernel(torch.tensor([tau]))[0, 0, 0], by_hand)


@pytest.mark.slow
def test_monte_carlo_mean_converges_to_the_kernel_at_rate_one_over_sqrt_r():
    enc = _encoding(p=(3, 3), h=2, d=16)
    grid = (5, 5)
    pairs = [((2, 2), (2, 2)), ((3, 4), (2, 3)), ((0, 4), (1, 3)), ((4, 0), (3, 2)), ((1, 1), (4, 4))]
    m = torch.tensor([a[0] * grid[1] + a[1] for a, _ in pairs])
    n = torch.tensor([b[0] * grid[1] + b[1] for _, b in pairs])
    offsets = torch.tensor([[a[0] - b[0], a[1] - b[1]] for a, b in pairs])
    exact = enc.kernel(offsets).permute(2, 0, 1).detach()  # (T, H, D)
    count = enc.num_heads * enc.head_dim  # independent (head, feature) estimates per pair
    errs = []
    for r, seed in ((64, 1), (1024, 2)):
        code = enc(grid, num_realizations=r, generator=torch.Generator().manual_seed(seed))
        est = (code.qbar[m] * code.kbar[n]).sum(-1).detach() / r  # (T, H, D)
        # ê averages R products (a·Z)(b·Z) with ‖a‖ = ‖Φ^Q‖, ‖b‖ = ‖Φ^K‖, a·b = P(τ), so
        # Var ê = (‖Φ^Q‖²‖Φ^K‖² + P²)/R; the mean of `count` squared z-scores is 1 ± 4·√(2/count).
        aa, bb = enc.filters_q.pow(2).sum((-2, -1)).detach(), enc.filters_k.pow(2).sum((-2, -1)).detach()
        z = (est - exact) / torch.sqrt((aa * bb + exact**2) / r)
        assert torch.all((z.pow(2).mean(dim=(1, 2)) - 1).abs() < 4 * math.sqrt(2 / count))
        errs.append((est - exact).pow(2).mean().sqrt())
    # 16× more realisations: RMS error 4× smaller, within the spread of an RMS over count·T terms.
    spread = 4 * math.sqrt(0.5 / (count * len(pairs)))
    assert 4 * (1 - spread) < errs[0] / errs[1] < 4 * (1 + spread) * 1.05


def test_gradients_reach_both_filters():
    enc = ConvSPE2d(2, 4, num_realizations=8, kernel_size=5)
    code = enc((6, 6), generator=torch.Generator().manual_seed(0))
    (code.qbar * code.kbar.roll(1, 0)).sum().backward()
    for f in (enc.filters_q, enc.filters_k):
        assert f.grad is not None and f.grad.abs().sum() > 0 and torch.isfinite(f.grad).all()
    # The default filters peak at offset 0 and decay with the distance, in both axes.
    k = enc.kernel(torch.tensor([[0, 0], [1, 0], [0, 1], [2, 2], [5, 0]]))[0, 0].detach()
    assert abs(k[0] - 1) < 0.05 and k[0] > k[1] > k[3] > 0 and k[0] > k[2] and k[4] == 0


def test_errors_name_the_value():
    with pytest.raises(ValueError, match="impl"):
        ConvSPE2d(1, 1, impl="fast")
    with pytest.raises(ValueError, match="kernel_size_rows"):
        ConvSPE2d(1, 1, kernel_size=(0, 3))
    with pytest.raises(ValueError, match="height"):
        ConvSPE2d(1, 1)((0, 4))
    with pytest.raises(ValueError, match=r"\(T, 2\)"):
        ConvSPE2d(1, 1).kernel(torch.tensor([1, 2]))

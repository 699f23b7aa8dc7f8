"""sineSPE: exact kernel, Monte-Carlo convergence at the 1/√R rate, phase precision."""

import math

import pytest
import torch

from spe import SineSPE
from spe.encodings.sine import sine_phase


def _encoding(h=8, d=32, k=3, seed=0):
    torch.manual_seed(seed)
    enc = SineSPE(h, d, num_realizations=8, num_sines=k).double()
    with torch.no_grad():  # a generic kernel: random phases and gains, spread frequencies
        enc.phases.uniform_(-math.pi, math.pi)
        enc.gains.normal_()
        enc.frequency_logits.normal_(-2.0, 1.5)
    return enc


def _standardised_errors(enc, r, lags, seed):
    """(ê − P) / σ for pairs (m, n) = (lag, 0), one independent entry per (head, feature).

    ê = Q̄_d(m)·K̄_d(n) / R is an average of R i.i.d. products a·Z_r · b·Z_r with a·b = P(m−n);
    for Gaussian Z its variance is exactly ((a·a)(b·b) + (a·b)²) / R.
    """
    code = enc(query_positions=torch.tensor(lags), key_positions=torch.tensor([0.0]), num_realizations=r,
               generator=torch.Generator().manual_seed(seed))
    qbar, kbar = code.materialize()  # (T, H, D, R), (1, H, D, R)
    est = (qbar * kbar).sum(-1) / r  # (T, H, D)
    exact = enc.kernel(torch.tensor(lags)).permute(2, 0, 1)
    lam2 = enc.gains.repeat_interleave(2, -1).pow(2) / (2 * enc.num_sines)
    aa = (code.omega_q.pow(2) * lam2).sum(-1)
    bb = (code.omega_k.pow(2) * lam2).sum(-1)
    sigma = torch.sqrt((aa * bb + exact**2) / r)
    return (est - exact) / sigma, est - exact


def test_kernel_is_mean_of_code_products_at_rate_one_over_sqrt_r():
    enc = _encoding()
    # Real-valued lags too (continuous positions), and both signs (non-causal use: keys after
    # the query, where P(−τ) = (1/2K) Σ λ² cos(−2π f τ + θ) ≠ P(τ) once θ ≠ 0).
    lags = [0.0, 1.0, 2.5, 37.0, 300.0, -1.0, -37.0, -2.5]
    z_small, err_small = _standardised_errors(enc, 64, lags, seed=1)
    z_large, err_large = _standardised_errors(enc, 64 * 16, lags, seed=2)
    n = z_small[0].numel()  # 256 independent (head, feature) entries per lag
    tol = 4 * math.sqrt(2 / n)  # mean of n squared standard normals: sd √(2/n)
    for z in (z_small, z_large):
        msq = z.pow(2).mean(dim=(1, 2))
        assert torch.all((msq - 1).abs() < tol), msq
    # 16× more realisations: 4× smaller RMS error. The lags of one (head, feature) share its
    # noise Z_d, so only the n features are independent: each RMS has relative sd √(1/(2n)),
    # their ratio √(1/n); ±4 sd.
    ratio = err_small.pow(2).mean().sqrt() / err_large.pow(2).mean().sqrt()
    assert 4 * (1 - 4 / math.sqrt(n)) < ratio < 4 * (1 + 4 / math.sqrt(n))


def test_kernel_formula_matches_eq_18_over_2k():
    enc = _encoding(h=2, d=3, k=4)
    lags = torch.tensor([-3, 0, 2, 11])
    f, th, lam = enc.frequencies, enc.phases, enc.gains
    expected = torch.zeros(2, 3, 4, dtype=torch.float64)
    for i, tau in enumerate(lags.tolist()):
        expected[..., i] = (lam**2 * torch.cos(2 * math.pi * f * tau + th)).sum(-1) / (2 * 4)
    torch.testing.assert_close(enc.kernel(lags), expected)


def test_phase_precise_at_large_positions_in_float32():
    f = torch.tensor([[[0.123456789, 0.0031, 0.49]]], dtype=torch.float32)
    pos = torch.tensor([8192, 123_457, 10**6])
    got = sine_phase(f, pos).double()
    exact = (2 * math.pi * torch.remainder(f.double()[None] * pos.double()[:, None, None, None], 1.0))
    err = torch.remainder(got - exact + math.pi, 2 * math.pi) - math.pi
    assert err.abs().max() < 1e-5
    naive = torch.remainder(2 * math.pi * f[None] * pos.float()[:, None, None, None], 2 * math.pi).double()
    naive_err = torch.remainder(naive - exact + math.pi, 2 * math.pi) - math.pi
    assert naive_err.abs().max() > 100 * err.abs().max()  # what the reduction buys


def test_realizations_may_change_at_test_time_and_bad_arguments_raise():
    enc = SineSPE(2, 4, num_realizations=8, num_sines=2)
    assert enc(6, num_realizations=3).weights.shape == (2, 4, 4, 3)
    with pytest.raises(ValueError, match="exactly one"):
        enc(4, positions=torch.arange(4))
    with pytest.raises(ValueError, match="num_sines"):
        SineSPE(2, 4, 8, 0)
    with pytest.raises(ValueError, match="frequency_init"):
        SineSPE(2, 4, 8, 2, frequency_init="nope")


@pytest.mark.slow
def test_orthogonal_noise_is_unbiased_and_exact_per_feature():
    enc = _encoding(h=2, d=8, k=3)
    enc.noise = "orthogonal"
    lags = torch.tensor([0.0, 3.0, 40.0])
    exact = enc.kernel(lags).permute(2, 0, 1)
    # 2K = 6 ≤ R = 16: each feature's estimate Q̄_d K̄_dᵀ / R equals the kernel exactly.
    code = enc(query_positions=lags, key_positions=torch.tensor([0.0]), num_realizations=16,
               generator=torch.Generator().manual_seed(0))
    qbar, kbar = code.materialize()
    torch.testing.assert_close((qbar * kbar).sum(-1) / 16, exact)
    # 2K > R = 4: no longer exact, but still unbiased: standardised mean over draws.
    draws = []
    for s in range(400):
        qbar, kbar = enc(query_positions=lags, key_positions=torch.tensor([0.0]), num_realizations=4,
                         generator=torch.Generator().manual_seed(s)).materialize()
        draws.append((qbar * kbar).sum(-1) / 4)
    draws = torch.stack(draws)
    z = (draws.mean(0) - exact) / (draws.std(0) / 20 + 1e-12)
    assert z.pow(2).mean() < 1 + 4 * (2 / z.numel()) ** 0.5


@pytest.mark.parametrize("noise", ["gaussian", "orthogonal"])
def test_float32_and_float64_modules_draw_the_same_code_from_the_same_seed(noise):
    # The noise used to be drawn in the module dtype, so a float64 copy
    # drew different numbers (outputs moved by ≈ 5.6). Now only float32 rounding separates them.
    enc32 = SineSPE(2, 4, num_realizations=8, num_sines=3, noise=noise)
    enc64 = SineSPE(2, 4, num_realizations=8, num_sines=3, noise=noise)
    enc64.load_state_dict(enc32.state_dict())
    enc64.double()
    c32, c64 = (e(20, generator=torch.Generator().manual_seed(5)) for e in (enc32, enc64))
    assert c64.weights.dtype == torch.float64
    for a, b in [(c32.weights, c64.weights), (c32.gate_noise, c64.gate_noise), *zip(c32.materialize(), c64.materialize())]:
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def test_kernel_at_negative_lags_is_the_mirrored_phase():
    # P(−τ; θ) = P(τ; −θ): what an encoder (keys on both sides) sees is the same family.
    enc = _encoding(h=2, d=3, k=4)
    lags = torch.tensor([0.5, 3.0, 40.0])
    mirrored = _encoding(h=2, d=3, k=4)
    with torch.no_grad():
        mirrored.phases.neg_()
    torch.testing.assert_close(enc.kernel(-lags), mirrored.kernel(lags))
    assert (enc.kernel(-lags) - enc.kernel(lags)).abs().max() > 1e-2  # not symmetric once θ ≠ 0


def test_a_half_precision_cast_keeps_sinespe_in_float32_and_q_hat_accurate_at_position_1000():
    # rounded to bfloat16, the frequencies put q̂ 90 % off float32 at positions 990-999
    from spe import SPEFilter
    torch.manual_seed(0)
    h, d, n = 2, 16, 1000
    enc, filt = SineSPE(h, d, frequency_init="spread"), SPEFilter(h, d)
    q = torch.randn(1, n, h, d)
    with torch.no_grad():
        ref, _ = filt(q, q, enc(n, generator=torch.Generator().manual_seed(0)))
        for dtype in (torch.bfloat16, torch.float16):
            cast = SineSPE(h, d, frequency_init="spread")
            cast.load_state_dict(enc.state_dict())
            cast.to(dtype)
            assert {p.dtype for p in cast.parameters()} == {torch.float32}
            x = q.to(dtype)
            out, _ = filt.to(dtype)(x, x, cast(n, generator=torch.Generator().manual_seed(0)))
            assert out.dtype == dtype
            for span in (slice(0, 10), slice(990, 1000)):
                err = (out[:, span].float() - ref[:, span]).norm() / ref[:, span].norm()
                assert err < 0.01, (dtype, span, float(err))
            filt.float()
    assert enc.double().frequency_logits.dtype == torch.float64  # a float64 cast applies as before

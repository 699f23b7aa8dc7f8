"""convSPE: exact vanishing kernel, Monte-Carlo convergence, FFT = direct, prefix consistency."""

import math

import pytest
import torch

from spe import ConvSPE


def _encoding(p=7, h=4, d=64, seed=0, causal=True):
    torch.manual_seed(seed)
    enc = ConvSPE(h, d, num_realizations=8, kernel_size=p, causal=causal).double()
    with torch.no_grad():
        enc.filters_q.normal_(0, 1 / math.sqrt(p))
        enc.filters_k.normal_(0, 1 / math.sqrt(p))
    return enc


def test_kernel_matches_explicit_sum_and_vanishes_beyond_kernel_size():
    enc = _encoding(p=5, h=1, d=2)
    lags = torch.arange(-7, 8)
    got = enc.kernel(lags)
    fq, fk = enc.filters_q, enc.filters_k
    for i, tau in enumerate(lags.tolist()):
        expected = sum(fq[..., p] * fk[..., p - tau] for p in range(5) if 0 <= p - tau < 5) if abs(tau) < 5 else 0
        torch.testing.assert_close(got[..., i], torch.as_tensor(expected, dtype=torch.float64).expand(1, 2))
    assert torch.all(got[..., lags.abs() >= 5] == 0)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
def test_kernel_is_mean_of_code_products_at_rate_one_over_sqrt_r(causal):
    # Both lag signs: a centred (non-causal) filter shifts Q̄ and K̄ alike, so kernel() holds.
    enc = _encoding(causal=causal)
    lags = torch.tensor([0, 1, 3, 6, 9, -1, -4])
    n = enc.num_heads * enc.head_dim  # independent (head, feature) entries per lag
    errs = []
    for r, seed in ((64, 1), (1024, 2)):
        code = enc(query_positions=20 + lags, key_positions=torch.tensor([20]), num_realizations=r,
                   generator=torch.Generator().manual_seed(seed))
        est = (code.qbar * code.kbar).sum(-1) / r  # (T, H, D)
        exact = enc.kernel(lags).permute(2, 0, 1)
        # ê averages R products (a·Z)(b·Z) with ‖a‖ = ‖Φ^Q‖, ‖b‖ = ‖Φ^K‖, a·b = P: variance known.
        aa, bb = enc.filters_q.pow(2).sum(-1), enc.filters_k.pow(2).sum(-1)
        z = (est - exact) / torch.sqrt((aa * bb + exact**2) / r)
        assert torch.all((z.pow(2).mean(dim=(1, 2)) - 1).abs() < 4 * math.sqrt(2 / n))
        errs.append((est - exact).pow(2).mean().sqrt())
    # The lags of one feature share its noise: n independent entries, ratio sd √(1/n), ±4 sd.
    ratio = errs[0] / errs[1]
    assert 4 * (1 - 4 / math.sqrt(n)) < ratio < 4 * (1 + 4 / math.sqrt(n))


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("p", [1, 4, 33])
def test_fft_equals_direct_convolution_forward_and_backward(p, causal):
    enc = _encoding(p=p, h=2, d=3, causal=causal)
    outs = {}
    for impl in ("fft", "direct"):
        enc.impl = impl
        enc.zero_grad()
        code = enc(50, generator=torch.Generator().manual_seed(3))
        w = torch.linspace(-1, 1, code.qbar.numel(), dtype=torch.float64).view_as(code.qbar)
        ((code.qbar * w).sum() + (code.kbar * w.flip(0)).sum()).backward()
        outs[impl] = (code.qbar, code.kbar, enc.filters_q.grad.clone(), enc.filters_k.grad.clone())
    for a, b in zip(outs["fft"], outs["direct"]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("causal", [True, False])
def test_code_of_a_prefix_and_of_single_positions_agree(causal):
    enc = _encoding(p=6, h=2, d=3, causal=causal)
    g = lambda: torch.Generator().manual_seed(11)
    long = enc(300, generator=g())
    short = enc(130, generator=g())
    torch.testing.assert_close(long.qbar[:130], short.qbar)
    single = enc(query_positions=torch.tensor([257]), key_positions=torch.tensor([4, 199]), generator=g())
    torch.testing.assert_close(single.qbar[0], long.qbar[257])
    torch.testing.assert_close(single.kbar, long.kbar[[4, 199]])


def test_bad_positions_raise():
    enc = ConvSPE(1, 2, 4, 3)
    with pytest.raises(ValueError, match="integers"):
        enc(positions=torch.tensor([0.5, 1.5]))
    with pytest.raises(ValueError, match="kernel_size"):
        ConvSPE(1, 2, 4, 0)
    with pytest.raises(ValueError, match="≥ 0, got -2"):
        enc(query_positions=torch.tensor([-2, 0]), key_positions=torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="causal"):
        ConvSPE(1, 2, 4, 3, causal="no")


def test_float32_and_float64_modules_draw_the_same_code_from_the_same_seed():
    enc32 = ConvSPE(2, 3, num_realizations=4, kernel_size=5)
    enc64 = ConvSPE(2, 3, num_realizations=4, kernel_size=5)
    enc64.load_state_dict(enc32.state_dict())
    enc64.double()
    c32, c64 = (e(30, generator=torch.Generator().manual_seed(5)) for e in (enc32, enc64))
    for a, b in [(c32.qbar, c64.qbar), (c32.kbar, c64.kbar), (c32.gate_noise, c64.gate_noise)]:
        assert b.dtype == torch.float64
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_fft_path_equals_explicit_sum_over_the_documented_noise():
    # The FFT path reads noise_span (time-last blocks); the explicit sum reads noise(times):
    # both must see the same Z(t) and apply Q̄(t) = Σ_p Φ(p) Z(t − p + c).
    for causal in (True, False):
        enc = _encoding(p=5, h=2, d=3, causal=causal)
        code = enc(40, num_realizations=4, generator=torch.Generator().manual_seed(7))
        seed = int(torch.randint(0, 1 << 31, (1,), generator=torch.Generator().manual_seed(7)))
        t = torch.arange(40)[:, None] + enc.shift - torch.arange(5)[None]  # (L, P)
        z = enc.noise(t.flatten(), 4, seed).view(40, 5, 2, 3, 4)
        torch.testing.assert_close(code.qbar, torch.einsum("lphdr,hdp->lhdr", z, enc.filters_q))
        span = enc.noise_span(-4, 44, 4, seed)
        torch.testing.assert_close(span, enc.noise(torch.arange(-4, 40), 4, seed).permute(1, 2, 3, 0))


def test_fft_size_is_the_smallest_5_smooth_length():
    from spe.encodings.conv import fft_size

    def smooth(m):
        for q in (2, 3, 5):
            while m % q == 0:
                m //= q
        return m == 1

    for n in [*range(1, 200), 4223, 8319]:
        f = fft_size(n)
        assert f >= n and smooth(f) and not any(smooth(m) for m in range(n, f)), (n, f)
    assert fft_size(4223) == 4320


@pytest.mark.parametrize("impl", ["fft", "direct"])
def test_codes_are_contiguous_so_layers_sharing_them_copy_nothing(impl):
    # A model shares one code across its layers; a strided (time-last) view made every
    # layer's code product copy (and keep for backward) its own transposed code.
    enc = ConvSPE(2, 8, num_realizations=4, kernel_size=5, impl=impl)
    code = enc(16, generator=torch.Generator().manual_seed(0))
    for bar in (code.qbar, code.kbar):
        assert bar.shape == (16, 2, 8, 4) and bar.is_contiguous()


def test_auto_filters_by_fft_at_every_kernel_size():
    # spans of the noise filtered by FFT were measured faster than conv1d from P = 4 on
    for p in (1, 4, 15, 16, 64):
        assert ConvSPE(1, 2, 4, p).uses_fft and ConvSPE(1, 2, 4, p, impl="fft").uses_fft
        assert not ConvSPE(1, 2, 4, p, impl="direct").uses_fft

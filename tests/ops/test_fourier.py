"""Fourier mixing (spe.ops.fourier): FNet against torch's 2-D FFT, the causal twin and the padded
form against the float64 O(L²) matrices forward and backward, causality, float32 at 16,384
positions, the decoding step and prefill against the parallel forward, and the input checks."""

from __future__ import annotations

import math

import pytest
import torch

from spe.ops import FourierState, fourier_mixing, fourier_mixing_step
from spe.ops.fourier import causal_fourier_mixing_with_state, naive_fourier_mixing

B, C = 2, 6


def _x(length, *, dtype=torch.float64, seed=0, batch=B):
    return torch.randn(batch, length, C, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _grad(fn, x, **kwargs):
    leaf = x.detach().clone().requires_grad_()
    out = fn(leaf, **kwargs)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    (out * probe).sum().backward()
    return out.detach(), leaf.grad


@pytest.mark.parametrize("norm", ["backward", "ortho"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fnet_is_the_real_part_of_the_2d_fft(norm, dtype):
    x = _x(11, dtype=dtype)
    y = fourier_mixing(x, norm=norm)
    assert y.dtype == dtype
    torch.testing.assert_close(y, torch.fft.fft2(x, norm=norm).real)
    torch.testing.assert_close(y.double(), naive_fourier_mixing(x, norm=norm), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("length,n", [(7, 5), (13, 13), (37, 8), (30, 64), (1, 3)])
@pytest.mark.parametrize("norm", ["backward", "ortho"])
def test_causal_form_equals_the_dft_matrix_forward_and_backward(length, n, norm):
    x = _x(length)  # ragged lengths, L > N and L < N, no power of two
    y, g = _grad(fourier_mixing, x, causal=True, length=n, norm=norm)
    y_ref, g_ref = _grad(naive_fourier_mixing, x, causal=True, length=n, norm=norm)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10)


def test_causal_row_n_minus_one_is_fnets_row_and_beyond_n_frequencies_wrap():
    n = 9
    x = _x(3 * n)
    y = fourier_mixing(x, causal=True, length=n, norm="ortho")
    # at m = N − 1 the prefix is the whole N-point input: FNet's (unitary) DFT row, sign and scale
    full = torch.fft.fft2(x[:, :n], norm="ortho").real
    torch.testing.assert_close(y[:, n - 1], full[:, n - 1])
    # beyond N, position m reads frequency m mod N of its whole prefix
    m = 2 * n + 4
    u = torch.fft.fft(x[:, :m + 1], dim=-1, norm="ortho")
    w = torch.exp(-2j * math.pi * (m % n) * torch.arange(m + 1, dtype=torch.float64) / n)
    torch.testing.assert_close(y[:, m], (w[None, :, None] * u).sum(1).real / math.sqrt(n))


def test_causal_future_tokens_change_no_output():
    x = _x(40)
    y = fourier_mixing(x, causal=True, length=16)
    for cut in (0, 17, 39):
        changed = x.clone()
        changed[:, cut + 1:] = torch.randn_like(changed[:, cut + 1:]) * 100
        torch.testing.assert_close(fourier_mixing(changed, causal=True, length=16)[:, :cut + 1], y[:, :cut + 1],
                                   rtol=0, atol=1e-11)
    x2 = x.clone()
    x2[:, 17] += torch.randn(B, C, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert (fourier_mixing(x2, causal=True, length=16)[:, 17:] - y[:, 17:]).abs().amax(-1).min() > 1e-3


def _mask(lengths, total):
    return torch.arange(total)[None] >= torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("norm", ["backward", "ortho"])
def test_padding_mask_mixes_each_sequence_over_its_own_length(norm):
    lengths, total = [12, 7, 1], 12
    x = _x(total, batch=3)
    mask = _mask(lengths, total)
    y, g = _grad(fourier_mixing, x, key_padding_mask=mask, norm=norm)
    y_ref, g_ref = _grad(naive_fourier_mixing, x, key_padding_mask=mask, norm=norm)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10)
    for i, n in enumerate(lengths):  # the sequence alone, unpadded: FNet's own DFT
        torch.testing.assert_close(y[i, :n], torch.fft.fft2(x[i, :n], norm=norm).real)
    assert (y[mask] == 0).all() and (g[mask] == 0).all()  # padding: no output, no gradient
    noisy = torch.where(mask[..., None], torch.randn_like(x) * 1e3, x)
    torch.testing.assert_close(fourier_mixing(noisy, key_padding_mask=mask, norm=norm), y)
    unpadded = _mask([total] * 3, total)  # a batch without padding: FNet's own transform
    torch.testing.assert_close(fourier_mixing(x, key_padding_mask=unpadded, norm=norm),
                               naive_fourier_mixing(x, norm=norm), rtol=1e-10, atol=1e-10)


def test_float32_at_16384_positions_within_eps_log_length():
    length = 16_384
    x = _x(length, batch=1)
    bound = 2 * torch.finfo(torch.float32).eps * math.log2(length)  # measured ≈ 0.17 of it
    for kwargs in ({"causal": True, "length": 256}, {"causal": True, "length": length}, {}):
        exact = fourier_mixing(x, norm="ortho", **kwargs)
        single = fourier_mixing(x.float(), norm="ortho", **kwargs).double()
        assert ((single - exact).norm() / exact.norm()).item() < bound, kwargs
    mask = _mask([length - 300], length)
    exact = fourier_mixing(x, norm="ortho", key_padding_mask=mask)
    single = fourier_mixing(x.float(), norm="ortho", key_padding_mask=mask).double()
    assert ((single - exact).norm() / exact.norm()).item() < bound


@pytest.mark.parametrize("n", [5, 16])
def test_steps_and_prefill_equal_the_parallel_forward(n):
    x = _x(23)
    full = fourier_mixing(x, causal=True, length=n, norm="ortho")
    state, outs = None, []
    for t in range(23):
        y, state = fourier_mixing_step(x[:, t:t + 1], state, n, norm="ortho")
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-10, atol=1e-10)
    assert state.position == 23 and state.sums.shape == (B, n, C) and state.length == n
    # prefill 9 positions, then steps; and two prefills in a row, with gradients through the state
    y1, s1 = causal_fourier_mixing_with_state(x[:, :9], n, norm="ortho")
    torch.testing.assert_close(s1.sums, _steps_state(x[:, :9], n).sums, rtol=1e-10, atol=1e-10)
    y2, s2 = causal_fourier_mixing_with_state(x[:, 9:], n, norm="ortho", initial_state=s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), full, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s2.sums, state.sums, rtol=1e-10, atol=1e-10)
    y, _ = fourier_mixing_step(x[:, 9:10], s1, n, norm="ortho")
    torch.testing.assert_close(y, full[:, 9:10], rtol=1e-10, atol=1e-10)

    def two_prefills(leaf):
        first, carried = causal_fourier_mixing_with_state(leaf[:, :9], n, norm="ortho")
        return torch.cat([first, causal_fourier_mixing_with_state(leaf[:, 9:], n, norm="ortho",
                                                                   initial_state=carried)[0]], 1)

    _, g = _grad(two_prefills, x)
    _, g_ref = _grad(naive_fourier_mixing, x, causal=True, length=n, norm="ortho")
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10)


def _steps_state(x, n):
    state = None
    for t in range(x.shape[1]):
        _, state = fourier_mixing_step(x[:, t:t + 1], state, n, norm="ortho")
    return state


def test_float32_steps_keep_the_parallel_forward_far_beyond_n():
    x = _x(600, dtype=torch.float32, batch=1)
    full = fourier_mixing(x, causal=True, length=64, norm="ortho")
    _, state = causal_fourier_mixing_with_state(x[:, :590], 64, norm="ortho")
    outs = []
    for t in range(590, 600):
        y, state = fourier_mixing_step(x[:, t:t + 1], state, 64, norm="ortho")
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), full[:, 590:], rtol=1e-4, atol=1e-4)


def test_bad_arguments_are_refused_naming_them():
    x = _x(6)
    with pytest.raises(ValueError, match="length.*None"):
        fourier_mixing(x, causal=True)
    with pytest.raises(ValueError, match="length.*0"):
        fourier_mixing(x, causal=True, length=0)
    with pytest.raises(ValueError, match="N = 6"):
        fourier_mixing(x, length=6)
    with pytest.raises(ValueError, match="'unitary'"):
        fourier_mixing(x, norm="unitary")
    with pytest.raises(ValueError, match="key_padding_mask"):
        fourier_mixing(x, causal=True, length=4, key_padding_mask=_mask([3, 6], 6))
    with pytest.raises(ValueError, match="right padding"):
        fourier_mixing(x, key_padding_mask=torch.tensor([[True, False] * 3] * B))
    with pytest.raises(ValueError, match=r"\(2, 6\)"):
        fourier_mixing(x, key_padding_mask=_mask([3], 6))
    with pytest.raises(ValueError, match=r"\(2, 4, 6\)"):
        fourier_mixing_step(x[:, :1], FourierState(sums=torch.zeros(B, 5, C, dtype=torch.complex128)), 4)
    with pytest.raises(ValueError, match="position"):
        FourierState(sums=torch.zeros(B, 4, C, dtype=torch.complex64), position=-1)

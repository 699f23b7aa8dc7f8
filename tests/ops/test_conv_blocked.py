"""convSPE applied a block of positions at a time: equal to the float64 whole-code form forward
and backward, equal to the materialised filter in a layer and a model, and holding no code."""

import math

import pytest
import torch

from spe import ConvSPE, SPEFilter
from spe.encodings.code import ConvCode
from spe.models import DecoderLM, ModelConfig
from spe.ops.conv import conv_code_product, conv_code_product_reference
from spe.ops.conv.blocked import block_length
from spe.ops.sine.costs import MATERIALIZE_LIMIT


def _inputs(b=2, n=37, h=2, d=3, r=4, p=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(h, d, r, n + p - 1, generator=g, dtype=torch.float64)
    leaves = [torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()
              for s in ((b, n, h, d), (b, n, h, d), (h, d, p), (h, d, p))]
    return z, leaves


@pytest.mark.parametrize("use_fft", [True, False])
@pytest.mark.parametrize("block_elements", [1, 500, 1 << 20])  # blocks of P, of ~P·5, one block
def test_blocked_product_equals_the_whole_code_sum_forward_and_backward(use_fft, block_elements):
    z, (xq, xk, fq, fk) = _inputs()
    q, k = conv_code_product(xq, xk, z, fq, fk, use_fft=use_fft, block_elements=block_elements)
    qr, kr = conv_code_product_reference(xq, z, fq), conv_code_product_reference(xk, z, fk)
    torch.testing.assert_close(q, qr, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(k, kr, rtol=1e-10, atol=1e-10)
    # a loss that weighs every output differently, so a block written at the wrong place shows
    w = torch.randn(q.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = torch.autograd.grad((q * w).sum() + (k * w.flip(1)).sum(), (xq, xk, fq, fk))
    want = torch.autograd.grad((qr * w).sum() + (kr * w.flip(1)).sum(), (xq, xk, fq, fk))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_the_reference_is_eq_22_written_out():
    # Q̄_d(t) = Σ_p Φ_d(p) Z_d(t − p), with the span starting P − 1 samples before position 0.
    z, (x, _, fq, _) = _inputs(b=1, n=6, h=1, d=1, r=1, p=3)
    zz, f = z[0, 0, 0], fq[0, 0]
    code = torch.stack([sum(f[p] * zz[t + 2 - p] for p in range(3)) for t in range(6)])
    torch.testing.assert_close(conv_code_product_reference(x, z, fq)[0, :, 0, 0], x[0, :, 0, 0] * code)


def test_block_spans_are_powers_of_two_of_at_least_4p():
    for target, p, length in [(1, 5, None), (256, 128, None), (300, 64, None), (4096, 128, None), (7, 7, None),
                              (1024, 64, 8192), (1024, 64, 100), (1 << 20, 3, 37)]:
        n = block_length(target, p, length)
        span = n + p - 1
        assert span & (span - 1) == 0 and span >= 4 * p
        # no more than the target unless 4P is, and no span longer than one covering the length
        assert n <= target or span < 8 * p
        if length is not None:
            assert span < 2 * (length + p - 1)


def test_bad_shapes_are_refused():
    z, (xq, xk, fq, fk) = _inputs()
    with pytest.raises(ValueError, match=r"noise must be \(H, D, R, L \+ P − 1\)"):
        conv_code_product(xq, xk, z[..., 1:], fq, fk)
    with pytest.raises(ValueError, match="do not fit"):
        conv_code_product(xq, xk[:, 1:], z, fq, fk)


def _encoding(causal, p=5, h=2, d=4):
    torch.manual_seed(0)
    enc = ConvSPE(h, d, num_realizations=6, kernel_size=p, causal=causal).double()
    with torch.no_grad():
        enc.filters_q.normal_(0, 1 / math.sqrt(p))
        enc.filters_k.normal_(0, 1 / math.sqrt(p))
    return enc


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("gated", [False, True])
def test_blocked_filter_equals_the_materialised_one(causal, gated):
    enc = _encoding(causal)
    code = enc(23, generator=torch.Generator().manual_seed(3))
    assert isinstance(code, ConvCode)
    x = torch.randn(2, 23, 2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    outs = {}
    for impl in ("materialized", "blocked"):
        filt = SPEFilter(2, 4, gated=gated, impl=impl, gate_init=0.3).double()
        assert filt.resolve_impl(2, code) == impl
        q, k = filt(x, 2 * x + 1, code)
        loss = (q * torch.linspace(-1, 1, q.numel(), dtype=torch.float64).view_as(q)).sum() + (k ** 2).sum()
        params = [enc.filters_q, enc.filters_k] + ([filt.gate_logits] if gated else [])
        outs[impl] = (q, k, *torch.autograd.grad(loss, params))
    for a, b in zip(outs["materialized"], outs["blocked"]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_auto_blocks_a_convspe_code_above_the_materialise_limit():
    def code(n, r=64, h=8, d=64, p=128):
        meta = dict(device="meta")
        return ConvCode(noise=torch.empty(h, d, r, n + p - 1, **meta), filters_q=torch.empty(h, d, p, **meta),
                        filters_k=torch.empty(h, d, p, **meta), use_fft=True, gate_noise=torch.empty(h, d, r, **meta))
    filt = SPEFilter(8, 64)
    small, large = code(MATERIALIZE_LIMIT // (8 * 64 * 64)), code(MATERIALIZE_LIMIT // (8 * 64 * 64) + 1)
    assert small.num_elements == MATERIALIZE_LIMIT and filt.resolve_impl(2, small) == "materialized"
    assert filt.resolve_impl(2, large) == "blocked"
    assert SPEFilter(8, 64, impl="materialized").resolve_impl(2, large) == "materialized"


def test_blocked_form_keeps_no_code_for_backward():
    # What autograd keeps between forward and backward: the materialised form holds the two
    # codes (each L·H·D·R); the blocked form holds only the noise span it filters again.
    enc = _encoding(True, p=5, h=2, d=4)
    x = torch.randn(1, 64, 2, 4, dtype=torch.float64, requires_grad=True)
    code_elements = 64 * 2 * 4 * 6
    for impl, most in (("materialized", None), ("blocked", (64 + 4) * 2 * 4 * 6)):
        code = enc(64, generator=torch.Generator().manual_seed(0))
        saved = []
        filt = SPEFilter(2, 4, impl=impl).double()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            q, k = filt(x, x, code)
        big = sum(n for n in saved if n >= code_elements)
        if most is None:
            assert big >= 2 * code_elements
        else:
            assert big <= most


@pytest.mark.parametrize("gated", [False, True])
def test_a_convspe_model_gives_the_same_loss_and_gradients_blocked_or_materialised(gated):
    tokens = torch.randint(0, 11, (2, 40), generator=torch.Generator().manual_seed(0))
    results = []
    for impl in ("materialized", "blocked"):
        torch.manual_seed(0)
        model = DecoderLM(ModelConfig(vocab_size=11, d_model=16, num_heads=2, num_layers=2, positional="convspe",
                                      kernel_size=6, num_realizations=4, gated=gated, spe_impl=impl,
                                      dropout=0.0)).double().eval()
        loss = model.loss(tokens)  # eval(): the code of code_seed, the same draw for both
        grads = torch.autograd.grad(loss, list(model.parameters()))
        results.append((loss, grads))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-10, atol=1e-12)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("use_fft", [True, False])
def test_future_noise_changes_no_past_product(use_fft):
    # position t reads the span's samples t … t + P − 1: samples from m + P − 1 on are the future of m − 1
    z, (xq, xk, fq, fk) = _inputs(n=70, p=5)
    m = 41  # inside a block of the 28 positions the least block holds at P = 5
    later = z.clone()
    later[..., m + 4:] = torch.randn(later[..., m + 4:].shape, dtype=torch.float64,
                                     generator=torch.Generator().manual_seed(9))
    q, k = conv_code_product(xq, xk, z, fq, fk, use_fft=use_fft, block_elements=1)
    q2, k2 = conv_code_product(xq, xk, later, fq, fk, use_fft=use_fft, block_elements=1)
    torch.testing.assert_close(q2[:, :m], q[:, :m], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k2[:, :m], k[:, :m], rtol=1e-12, atol=1e-12)
    assert (q2[:, m] - q[:, m]).abs().min() > 1e-6 and (k2[:, m] - k[:, m]).abs().min() > 1e-6


@pytest.mark.parametrize("use_fft", [True, False])
def test_gradients_of_some_inputs_only_and_of_a_sum_equal_the_reference(use_fft):
    # keys and Φ^Q frozen; the loss a plain sum, whose gradient PyTorch passes as an expanded (stride 0) tensor
    z, (xq, xk, fq, fk) = _inputs()
    xk, fq = xk.detach(), fq.detach()
    q, k = conv_code_product(xq, xk, z, fq, fk, use_fft=use_fft, block_elements=1)
    got = torch.autograd.grad(q.sum() + k.sum(), (xq, fk))
    want = torch.autograd.grad(conv_code_product_reference(xq, z, fq).sum()
                               + conv_code_product_reference(xk, z, fk).sum(), (xq, fk))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_float32_and_bfloat16_inputs_keep_their_dtypes_and_stay_near_float64():
    z, leaves = _inputs(n=50, h=2, d=8, r=4, p=6)
    want = [conv_code_product_reference(leaves[i], z, leaves[2 + i]) for i in (0, 1)]
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        xq, xk = (t.detach().to(dtype).requires_grad_() for t in leaves[:2])
        fq, fk = (t.detach().float().requires_grad_() for t in leaves[2:])
        q, k = conv_code_product(xq, xk, z.float(), fq, fk, block_elements=1)
        assert q.dtype == k.dtype == dtype
        scale = max(w.abs().max() for w in want)
        for got, ref in zip((q, k), want):
            assert (got.double() - ref).abs().max() <= tol * scale
        (q.float().square().sum() + k.float().sum()).backward()
        assert xq.grad.dtype == dtype and fq.grad.dtype == torch.float32 and torch.isfinite(fk.grad).all()


def _reference_codes(z, filters):
    # Q̄[t, h, d, r] = Σ_p Φ[h, d, p] Z[h, d, r, t + P − 1 − p], written out
    p = filters[0].shape[-1]
    windows = z.unfold(-1, p, 1)[..., :z.shape[-1] - p + 1, :].flip(-1)  # (H, D, R, L, P)
    return [torch.einsum("hdrtp,hdp->thdr", windows, f) for f in filters]


@pytest.mark.parametrize("block_elements", [1, 1 << 22])  # spans of 4P, one span
def test_fft_filter_in_spans_equals_the_written_out_codes_forward_and_backward(block_elements, monkeypatch):
    import spe.ops.conv.filters as filters

    monkeypatch.setattr(filters, "BLOCK_ELEMENTS", block_elements)
    z, (_, _, fq, fk) = _inputs(n=90, p=5)
    codes = filters.fft_filter(z, [fq, fk])
    want = _reference_codes(z, [fq, fk])
    w = torch.randn(want[0].shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for got, ref in zip(codes, want):
        assert got.is_contiguous()
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    got = torch.autograd.grad((codes[0] * w).sum() + codes[1].square().sum(), (fq, fk))
    ref = torch.autograd.grad((want[0] * w).sum() + want[1].square().sum(), (fq, fk))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # one code's gradient alone (the other unused): no gradient for the unused filter
    assert torch.autograd.grad(filters.fft_filter(z, [fq, fk])[1].sum(), (fq, fk), allow_unused=True)[0] is None


def test_fft_filter_codes_read_no_future_noise(monkeypatch):
    import spe.ops.conv.filters as filters

    monkeypatch.setattr(filters, "BLOCK_ELEMENTS", 1)
    z, (_, _, fq, _) = _inputs(n=90, p=5)
    m = 50
    later = z.clone()
    later[..., m + 4:] += 1.0
    before, after = filters.fft_filter(z, [fq])[0], filters.fft_filter(later, [fq])[0]
    torch.testing.assert_close(after[:m], before[:m], rtol=1e-12, atol=1e-12)
    assert (after[m] - before[m]).abs().min() > 1e-6

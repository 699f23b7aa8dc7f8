"""Python API edges of the encodings: dtypes, batch 0, head counts, sizes."""

import pytest
import torch

from spe import ConvSPE, SineSPE, SPEFilter
from spe.encodings import (LRPE, ALiBi, CosFormerReweighting, LearnedPositionalEmbedding,
                           MusicRelativePosition, PermuteFeatures, ShawRelativePosition,
                           SinusoidalPositionalEncoding)
from spe.encodings.conv2d import ConvSPE2d
from spe.encodings.oracle import ExactSPEScores

H, D, R, K, L = 2, 4, 6, 3, 7
SINE_IMPLS = ("auto", "fused", "materialized", "blocked", "reference")
# (encoding, filter impl): every way a code reaches the queries (convSPE codes are dense)
CASES = [("sine", impl) for impl in SINE_IMPLS] + [("conv", "auto"), ("conv", "reference")]


def _setup(kind: str, impl: str, gated: bool = True):
    torch.manual_seed(0)
    enc = SineSPE(H, D, R, K) if kind == "sine" else ConvSPE(H, D, R, kernel_size=3)
    filt = SPEFilter(H, D, impl=impl, gated=gated)
    if gated:
        with torch.no_grad():
            filt.gate_logits.normal_()  # a gate away from 1/2, so both of its terms count
    return enc, filt


def _qk(batch: int = 2, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(batch, L, H, D, generator=g, dtype=dtype),
            torch.randn(batch, L, H, D, generator=g, dtype=dtype))


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("kind,impl", CASES)
def test_float64_queries_cast_a_float32_code_and_match_an_all_float64_run(kind, impl, gated):
    enc, filt = _setup(kind, impl, gated)
    q, k = _qk(dtype=torch.float64)
    code = enc(L, generator=torch.Generator().manual_seed(2))
    qh, kh = filt(q, k, code)
    assert qh.dtype == kh.dtype == torch.float64
    # the same module in float64 draws the same noise (drawn in float32, then cast)
    code64 = enc.double()(L, generator=torch.Generator().manual_seed(2))
    qh64, kh64 = filt.double()(q, k, code64)
    torch.testing.assert_close(qh, qh64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kh, kh64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind,impl", CASES)
def test_half_precision_queries_give_half_precision_outputs_in_every_impl(kind, impl, dtype):
    enc, filt = _setup(kind, impl, gated=False)
    q, k = _qk()
    code = enc(L, generator=torch.Generator().manual_seed(2))
    qh, kh = filt(q.to(dtype), k.to(dtype), code)
    assert qh.dtype == kh.dtype == dtype
    ref_q, ref_k = filt(q, k, code)
    torch.testing.assert_close(qh.float(), ref_q, rtol=0.05, atol=0.05)
    torch.testing.assert_close(kh.float(), ref_k, rtol=0.05, atol=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("kind,impl", CASES)
def test_bf16_autocast_as_the_model_calls_it_gives_bf16_in_every_impl(kind, impl):
    enc, filt = _setup(kind, impl)
    proj = torch.nn.Linear(D, D)
    q, k = _qk()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # queries and keys arrive in bf16, the code in float32
        qh, kh = filt(proj(q), proj(k), enc(L, generator=torch.Generator().manual_seed(2)))
    assert qh.dtype == kh.dtype == torch.bfloat16
    ref_q, _ = filt(proj(q), proj(k), enc(L, generator=torch.Generator().manual_seed(2)))
    torch.testing.assert_close(qh.float(), ref_q, rtol=0.05, atol=0.05)
    (qh.float().sum() + kh.float().sum()).backward()
    for p in (*enc.parameters(), filt.gate_logits):
        assert p.grad is not None and torch.isfinite(p.grad).all()


@pytest.mark.parametrize("kind,impl", CASES)
def test_batch_zero_gives_empty_outputs_and_gradients(kind, impl):
    enc, filt = _setup(kind, impl)
    q, k = _qk(batch=0)
    q.requires_grad_()
    qh, kh = filt(q, k, enc(L))
    assert qh.shape == kh.shape == (0, L, H, R)
    (qh.sum() + kh.sum()).backward()
    assert q.grad.shape == q.shape
    assert torch.count_nonzero(filt.gate_logits.grad) == 0


@pytest.mark.parametrize("kind,impl", CASES)
def test_a_code_for_other_heads_is_refused_naming_both(kind, impl):
    _, filt = _setup(kind, impl)
    other = SineSPE(3, D, R, K) if kind == "sine" else ConvSPE(3, D, R, kernel_size=3)
    q, k = _qk()
    with pytest.raises(ValueError, match=r"SPEFilter.*num_heads 3, head_dim 4.*num_heads 2, head_dim 4"):
        filt(q, k, other(L))


@pytest.mark.parametrize("kind,impl", CASES)
def test_integer_queries_are_refused(kind, impl):
    enc, filt = _setup(kind, impl)
    q, k = _qk()
    with pytest.raises(ValueError, match=r"SPEFilter: queries .*floating point.*torch.int64"):
        filt(q.long(), k, enc(L))


@pytest.mark.parametrize("cls,name", [(SineSPE, "SineSPE"), (ConvSPE, "ConvSPE")])
@pytest.mark.parametrize("length", [4.5, True, 4.0])
def test_a_length_that_is_not_a_positive_integer_is_refused(cls, name, length):
    with pytest.raises(ValueError, match=rf"{name}: length .*positive integer.*got {length!r}$"):
        cls(H, D, R)(length=length)


@pytest.mark.parametrize("cls,name", [(SineSPE, "SineSPE"), (ConvSPE, "ConvSPE")])
def test_a_float_number_of_realizations_per_call_is_refused(cls, name):
    with pytest.raises(ValueError, match=rf"{name}: num_realizations .*got 2.0$"):
        cls(H, D, R)(L, num_realizations=2.0)


@pytest.mark.parametrize("build,owner,name,value", [
    (lambda: SineSPE(2.0, 4), "SineSPE", "num_heads", 2.0),
    (lambda: SineSPE(2, 4, num_sines=3.0), "SineSPE", "num_sines", 3.0),
    (lambda: ConvSPE(2.0, 4), "ConvSPE", "num_heads", 2.0),
    (lambda: ConvSPE(2, 4, 8, kernel_size=3.0), "ConvSPE", "kernel_size", 3.0),
    (lambda: SPEFilter(0, 4), "SPEFilter", "num_heads", 0),
    (lambda: SPEFilter(2, 4.5), "SPEFilter", "head_dim", 4.5),
    (lambda: ConvSPE2d(2, 4, kernel_size=2.5), "ConvSPE2d", "kernel_size_rows", 2.5),
    (lambda: ConvSPE2d(2, 4)((2.0, 3)), "ConvSPE2d", "height", 2.0),
    (lambda: LRPE(2, 0), "LRPE", "feature_dim", 0),
    (lambda: PermuteFeatures(2, -1), "PermuteFeatures", "feature_dim", -1),
    (lambda: CosFormerReweighting(True), "CosFormerReweighting", "max_length", True),
    (lambda: ALiBi(0), "ALiBi", "num_heads", 0),
    (lambda: SinusoidalPositionalEncoding(0), "SinusoidalPositionalEncoding", "d_model", 0),
    (lambda: LearnedPositionalEmbedding(8, 0), "LearnedPositionalEmbedding", "d_model", 0),
    (lambda: ShawRelativePosition(0, 4), "ShawRelativePosition", "head_dim", 0),
    (lambda: MusicRelativePosition(2.0, 4, 8), "MusicRelativePosition", "num_heads", 2.0),
    (lambda: ExactSPEScores(0, 4), "ExactSPEScores", "num_heads", 0),
])
def test_sizes_that_are_not_positive_integers_are_refused_naming_them(build, owner, name, value):
    with pytest.raises(ValueError, match=rf"{owner}: {name} .*positive integer.*got {value!r}$"):
        build()


def test_conv2d_sizes_that_are_not_pairs_are_refused():
    with pytest.raises(ValueError, match=r"ConvSPE2d: kernel_size .*pair.*got \(3,\)$"):
        ConvSPE2d(2, 4, kernel_size=(3,))
    with pytest.raises(ValueError, match=r"ConvSPE2d: grid .*pair.*got 5$"):
        ConvSPE2d(2, 4)(5)

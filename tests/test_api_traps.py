"""The public API's silent traps: each now refused, made deterministic or stated exactly."""

import math

import pytest
import torch

import spe
from spe.ops import elu_feature_map, linear_attention_step

B, L, H, D = 2, 12, 2, 4


def _signed_spe(seed=0, r=16):
    """SPE's q̂, k̂ (signed) and values, from a sineSPE code."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, L, H, D, generator=g) for _ in range(3))
    code = spe.SineSPE(H, D, num_realizations=r)(L, generator=g)
    q_hat, k_hat = spe.SPEFilter(H, D)(q, k, code)
    return q_hat, k_hat, v


@pytest.mark.parametrize("kernel", ["causal_linear_attention", "causal_linear_attention_with_state",
                                    "linear_attention"])
def test_signed_features_with_the_normaliser_are_refused_saying_what_to_pass(kernel):
    q_hat, k_hat, v = _signed_spe()
    with pytest.raises(ValueError, match=rf"^{kernel}: phi_q has negative entries.*elu_feature_map.*normalize=False"):
        getattr(spe, kernel)(q_hat, k_hat, v)
    # what the message says to pass is accepted: features, or the numerator alone
    fq, fk = elu_feature_map(q_hat), elu_feature_map(k_hat)
    out = getattr(spe, kernel)(fq, fk, v)
    assert torch.isfinite(out[0] if isinstance(out, tuple) else out).all()
    getattr(spe, kernel)(q_hat, k_hat, v, normalize=False)


def test_a_signed_separate_normaliser_and_a_signed_decoding_step_are_refused():
    q_hat, k_hat, v = _signed_spe()
    fq, fk = elu_feature_map(q_hat), elu_feature_map(k_hat)
    # RoFormer's form: signed (rotated) numerator features, a non-negative normaliser: accepted
    spe.causal_linear_attention(q_hat, k_hat, v, normalizer=(fq, fk))
    with pytest.raises(ValueError, match=r"normalizer\[0\] has negative entries"):
        spe.causal_linear_attention(fq, fk, v, normalizer=(q_hat, k_hat))
    with pytest.raises(ValueError, match=r"^linear_attention_step: phi_q has negative entries"):
        linear_attention_step(q_hat[:, :1], k_hat[:, :1], v[:, :1])


def test_the_refused_call_was_a_real_trap():
    """What the check prevents: a normaliser summing signed terms comes near 0, outputs blow up."""
    q_hat, k_hat, v = _signed_spe()
    from spe.ops.linear import unchecked_linear_attention

    unchecked = unchecked_linear_attention(q_hat, k_hat, v)
    assert unchecked.abs().max() > 5 * v.abs().max()  # not a weighted mean of the values


@pytest.mark.parametrize("make", [lambda: spe.SineSPE(H, D, 8), lambda: spe.ConvSPE(H, D, 8, 5)],
                         ids=["sinespe", "convspe"])
def test_an_spe_encoding_in_eval_mode_draws_the_same_code_and_in_training_a_new_one(make):
    torch.manual_seed(0)
    encoding, attention = make(), spe.MultiHeadAttention(H * D, H, attention="linear-elu",
                                                          positional=spe.SPEFilter(H, D))
    x = torch.randn(B, L, H * D)
    encoding.eval(), attention.eval()
    first, second = (attention(x, code=encoding(L)) for _ in range(2))
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    # another code_seed: another code, still the same at every call
    other = make()
    other.load_state_dict(encoding.state_dict())
    other.code_seed = 1
    other.eval()
    assert not torch.equal(attention(x, code=other(L)), first)
    encoding.train()
    assert not torch.equal(attention(x, code=encoding(L)), attention(x, code=encoding(L)))


def test_code_seed_is_checked():
    with pytest.raises(ValueError, match=r"SineSPE: code_seed .*\[0, 2\*\*63\).*got -1"):
        spe.SineSPE(H, D, code_seed=-1)
    with pytest.raises(ValueError, match=r"ConvSPE: code_seed must be .*got 1.5"):
        spe.ConvSPE(H, D, code_seed=1.5)


def test_the_normaliser_free_output_with_spe_is_sqrt_r_over_d_times_the_exact_kernels():
    """With orthogonal noise and 2K·D ≤ R, Z Zᵀ = R·I exactly, so q̂_m·k̂_n = √(R/D) Σ_d q_d k_d P_d(m − n)
    with no Monte-Carlo error (ungated: the gate's noise ε is not orthogonal to Z): the float64 O(L²) formula
    must match."""
    r, k_sines = 64, 2  # 2K·D = 16 ≤ R
    torch.manual_seed(0)
    encoding = spe.SineSPE(H, D, r, k_sines, noise="orthogonal").double()
    spe_filter = spe.SPEFilter(H, D).double()
    q, k, v = (torch.randn(B, L, H, D, dtype=torch.float64) for _ in range(3))
    q_hat, k_hat = spe_filter(q, k, encoding(L, generator=torch.Generator().manual_seed(1)))
    out = spe.causal_linear_attention(q_hat, k_hat, v, normalize=False, chunk_size=4)
    lags = torch.arange(L)[:, None] - torch.arange(L)[None, :]  # (m, n)
    kernel = encoding.kernel(lags.flatten()).view(H, D, L, L)  # P_d(m − n)
    scores = torch.einsum("bmhd,bnhd,hdmn->bhmn", q, k, kernel).tril()
    expected = math.sqrt(r / D) * torch.einsum("bhmn,bnhe->bmhe", scores, v)
    # the noise is drawn in float32 (orthogonal to ~1e-7); another factor (R/D, √R, 1) is off by 2× or more
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_a_learned_time_filter_refuses_the_plain_call_that_would_ignore_its_clock():
    torch.manual_seed(0)
    filt = spe.encodings.LearnedTimeSPEFilter(H, D, 8)
    with torch.no_grad():
        filt.clock.weight.normal_()  # a trained clock: its times are not the index
    x, q, k = torch.randn(B, L, 8), torch.randn(B, L, H, D), torch.randn(B, L, H, D)
    code = spe.SineSPE(H, D, num_realizations=8)(L, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"LearnedTimeSPEFilter .*clock.*f\.prepare\(x, None\).*context=times"):
        filt(q, k, code)
    times, _ = filt.prepare(x, None)
    q_hat, k_hat = filt(q, k, code, context=times)  # what the message says: the clock's times
    torch.testing.assert_close(q_hat, filt.encode_queries_keys(q, k, code=code, context=times)[0])
    # the trap the refusal closes: SPEFilter's call reads the index, not the clock
    index_q, _ = spe.SPEFilter.forward(filt, q, k, code)
    assert (index_q - q_hat).abs().max() > 0.1


def test_an_onset_filter_refuses_the_plain_call_that_would_ignore_the_onsets():
    filt = spe.encodings.sine.OnsetSPEFilter(H, D)
    q = torch.randn(B, L, H, D)
    code = spe.SineSPE(H, D, num_realizations=8)(L, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"OnsetSPEFilter .*onsets.*f\.prepare\(x, onsets\)"):
        filt(q, q, code)


def test_a_learned_time_rotation_refuses_index_positions_and_path_refuses_a_call():
    rot = spe.encodings.LearnedTimeRotary(8, H)
    x = torch.randn(B, L, H, D)
    with pytest.raises(ValueError, match=rf"LearnedTimeRotary .*\({B}, {L}, {H}\), got positions \({L},\)"):
        rot(x, torch.arange(L))
    times, _ = rot.prepare(torch.randn(B, L, 8), None)
    torch.testing.assert_close(rot(x, times), spe.encodings.rotate(x, times))
    path = spe.encodings.path.PathEncoding(8, H)
    with pytest.raises(ValueError, match=r"PathEncoding .*enc\.for_input\(x\)"):
        path(x, x, x)

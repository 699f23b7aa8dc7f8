"""The kernels' numerical defects (docs/numerics.md), each with a test that failed before its fix:

1. the normaliser's fixed ε = 1e-6 shrank outputs of sharp FAVOR+ attention;
2. wide sliding windows lost precision in float32 (differences of prefix sums);
3. FAVOR+ features dropped to bf16 under autocast;
6. the key-feature clamp at 80 changed the kernel and let sums overflow at large test-time R
   (keys now come with their log scale, carried by the kernels with a causal running maximum).
And every kernel keeps its sums in float32 under bf16 autocast.
"""

import math

import pytest
import torch

from spe.attention import MultiHeadAttention
from spe.encodings import RotaryEncoding
from spe.ops import (
    causal_linear_attention,
    causal_linear_attention_reference,
    causal_linear_attention_with_state,
    favor_feature_map,
    favor_key_features,
    linear_attention,
    linear_attention_step,
    orthogonal_random_features,
)


def _sharp_favor(spread, n=256, heads=2, dim=32, features=64):
    """FAVOR+ features of queries/keys whose q·k/√E has standard deviation ≈ ``spread``:
    query features, key features with c = 0 (``favor_feature_map``), and key features with
    their log scale apart (``favor_key_features``, what the attention layer uses)."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, n, heads, dim, generator=g) * math.sqrt(spread) for _ in range(2))
    w = orthogonal_random_features(heads, features, dim, generator=torch.Generator().manual_seed(1))
    return favor_feature_map(q, w, is_query=True), favor_feature_map(k, w, is_query=False), favor_key_features(k, w)


@pytest.mark.slow
@pytest.mark.parametrize("spread", [4.0, 6.0])
@pytest.mark.parametrize("scaled", [False, True])
def test_all_ones_values_give_one_for_sharp_favor_attention(spread, scaled):
    # Any weighted mean of ones is 1: only float32 rounding may show (before: 0.17 at spread 6).
    fq, fk, scaled_keys = _sharp_favor(spread)
    fk_scaled, log_scale = scaled_keys.features, scaled_keys.log_scale
    extra = {"key_log_scale": log_scale} if scaled else {}
    fk = fk_scaled if scaled else fk
    ones = torch.ones(1, fq.shape[1], 2, 8)
    outputs = {"causal": causal_linear_attention(fq, fk, ones, **extra),
               "non-causal": linear_attention(fq, fk, ones, **extra),
               "windowed": causal_linear_attention(fq, fk, ones, window=40, chunk_size=16, **extra)}
    for window in (None, 40):
        state, steps = None, []
        for t in range(fq.shape[1]):
            one = {"key_log_scale": log_scale[:, t:t + 1]} if scaled else {}
            y, state = linear_attention_step(fq[:, t:t + 1], fk[:, t:t + 1], ones[:, t:t + 1], state, window=window,
                                             **one)
            steps.append(y)
        outputs[f"recurrent, window {window}"] = torch.cat(steps, 1)
    for name, y in outputs.items():
        torch.testing.assert_close(y, torch.ones_like(y), atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("window", [2048, 2560, 16384])
def test_wide_windows_in_float32_match_float64_despite_a_huge_early_key(window):
    # One key feature ≈ 1e9 at position 3, then ordinary ones: before, W = 2,560 (> 32 whole
    # chunks) lost 2 % relative; the window sums now never subtract.
    n, c = window + 700, 64
    g = torch.Generator().manual_seed(0)
    fq, fk = (torch.rand(1, n, 1, 2, generator=g, dtype=torch.float64) + 0.1 for _ in range(2))
    v = torch.randn(1, n, 1, 2, generator=g, dtype=torch.float64)
    fk[0, 3] = 1e9
    exact = causal_linear_attention(fq, fk, v, window=window, chunk_size=c)
    single, state = causal_linear_attention_with_state(fq[:, :-2].float(), fk[:, :-2].float(), v[:, :-2].float(),
                                                       window=window, chunk_size=c)
    scale = exact.abs().max()
    assert ((single.double() - exact[:, :-2]).abs().max() / scale) < 1e-4
    for t in (n - 2, n - 1):  # the recurrent step (sums of the last W keys) agrees there too
        y, state = linear_attention_step(fq[:, t:t + 1].float(), fk[:, t:t + 1].float(), v[:, t:t + 1].float(),
                                         state, window=window)
        assert ((y.double() - exact[:, t:t + 1]).abs().max() / scale) < 1e-4


def test_favor_features_stay_float32_under_bf16_autocast():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, 2, 32, generator=g)
    w = orthogonal_random_features(2, 64, 32, generator=g)
    for is_query in (True, False):
        ref = favor_feature_map(x, w, is_query=is_query)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = favor_feature_map(x, w, is_query=is_query)
        assert low.dtype == torch.float32
        assert ((low - ref).abs() / ref).max() < 1e-3  # before: 3.5e-2


def _aligned_keys(dim=256, features=64):
    # Keys x' = a·ω_j along the longest projection row: their exponent ω_j·x' − ‖x'‖²/2 is
    # (a − a²/2)‖ω_j‖², 157 for a = 1 and 142 for a = 0.7 at E = 256, beyond the old clamp at 80
    # and beyond float32's exp.
    w = orthogonal_random_features(1, features, dim, generator=torch.Generator().manual_seed(0))
    j = w[0].norm(dim=-1).argmax()
    return w, torch.stack([w[0, j] * a * dim ** 0.25 for a in (1.0, 0.7)]).view(1, 2, 1, dim)


def _float64_attention(q, k, v, w):
    """Unstabilised FAVOR+ causal attention in float64 (exp up to e^700 is representable)."""
    def feats(x):
        x = x.double() / x.shape[-1] ** 0.25
        return torch.exp(torch.einsum("blhe,hme->blhm", x, w.double()) - 0.5 * (x ** 2).sum(-1, keepdim=True))
    a = torch.einsum("bmhf,bnhf->bhmn", feats(q), feats(k)).tril()
    return torch.einsum("bhmn,bnhe->bmhe", a, v.double()) / a.sum(-1).transpose(1, 2)[..., None]


def test_favor_kernel_is_exact_for_keys_beyond_the_old_clamp():
    # Values 1 on the stronger key, 0 on the other: the query (= the stronger key) weighs it
    # e^{15}-fold more; the old clamp gave both keys e^80 and an output far from 1.
    w, keys = _aligned_keys()
    keys = keys.flip(1)  # the weaker key first, so the query at position 1 sees both
    v = torch.tensor([0.0, 1.0]).view(1, 2, 1, 1)
    fk = favor_key_features(keys, w)  # ScaledFeatures: the kernel reads the scale
    fq = favor_feature_map(keys, w, is_query=True, eps=0.0)
    y = causal_linear_attention(fq, fk, v)
    torch.testing.assert_close(y.double(), _float64_attention(keys, keys, v, w), rtol=1e-5, atol=1e-6)


def test_favor_sums_do_not_overflow_at_large_test_time_r():
    # 4,096 keys at the clamp gave sums of 4096·e^80/8·|v| = 3e44 for |v| = 1e7: inf, then NaN.
    w, keys = _aligned_keys()
    keys = keys[:, :1].expand(1, 4096, 1, keys.shape[-1])
    fk = favor_key_features(keys, w)
    fq = favor_feature_map(keys, w, is_query=True)
    v = torch.full((1, 4096, 1, 2), 1e7)
    for window in (None, 1000):
        y = causal_linear_attention(fq, fk, v, window=window)
        torch.testing.assert_close(y, torch.full_like(y, 1e7), rtol=1e-5, atol=0)


@pytest.mark.parametrize("dim", [64, 512, 1024])
def test_favor_attention_matches_float64_at_any_test_time_r(dim):
    # Ordinary keys (‖x'‖ = 1) at R = E up to 1,024: the scaled kernel equals the float64
    # computation; a fixed data-independent key shift would underflow them to 0 here.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 64, 1, dim, generator=g)
    x = x / x.norm(dim=-1, keepdim=True) * dim ** 0.25
    v = torch.randn(1, 64, 1, 3, generator=g)
    w = orthogonal_random_features(1, 64, dim, generator=g)
    fk = favor_key_features(x, w)
    y = causal_linear_attention(favor_feature_map(x, w, is_query=True, eps=0.0), fk, v)
    torch.testing.assert_close(y.double(), _float64_attention(x, x, v, w), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attention,rotary", [("softmax", False), ("softmax", True), ("performer", False),
                                              ("performer", True), ("linear-elu", False), ("linear-relu", False)])
def test_attention_layer_keeps_float32_sums_under_bf16_autocast(attention, rotary):
    # Projections q = k = v = x/2 and an identity output are exact in bf16 for a bf16 input, so
    # under autocast only the roundings of the features, the rotation inputs and the output
    # (each 2⁻⁹ relative) may differ from float32: 2·2⁻⁸ of each row's scale. Summing the
    # 2,048 positions in bf16 instead gave 0.013 to 0.021 (checked by making the kernels' dtype
    # bf16 under autocast), and bf16 FAVOR+ features 0.018.
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 2, attention=attention, positional=RotaryEncoding() if rotary else None,
                               num_features=32)
    with torch.no_grad():
        layer.qkv.weight.copy_(torch.cat([torch.eye(32)] * 3) * 0.5)
        layer.out.weight.copy_(torch.eye(32))
    x = torch.randn(1, 2048, 32).bfloat16().float()
    ref = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = layer(x)
    assert ((low.float() - ref).abs() / ref.abs().amax(-1, keepdim=True)).max() < 2 * 2 ** -8


@pytest.mark.parametrize("window", [None, 1, 3, 7, 40])
def test_windows_of_keys_whose_log_scales_all_lie_below_the_old_sentinel(window):
    # Empty blocks and keys outside a window had log scale −10⁴; with every real key's
    # below it, that became the window's scale and every weight underflowed (outputs 0).
    g = torch.Generator().manual_seed(6)
    fq, fk = (torch.rand(2, 17, 3, 4, generator=g, dtype=torch.float64) + 0.1 for _ in range(2))
    v = torch.randn(2, 17, 3, 5, generator=g, dtype=torch.float64)
    log_scale = 30 * torch.randn(2, 17, 3, generator=g, dtype=torch.float64) - 2e4
    y = causal_linear_attention(fq, fk, v, chunk_size=2, window=window, key_log_scale=log_scale)
    reference = causal_linear_attention_reference(fq, fk, v, window=window, key_log_scale=log_scale)
    torch.testing.assert_close(y, reference)
    state, steps = None, []
    for t in range(17):
        out, state = linear_attention_step(fq[:, t:t + 1], fk[:, t:t + 1], v[:, t:t + 1], state, window=window,
                                           key_log_scale=log_scale[:, t:t + 1])
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), reference)

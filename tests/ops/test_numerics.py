"""Issue 12's numerical defects, each with a test that failed before its fix:

1. the normaliser's fixed ε = 1e-6 shrank outputs of sharp FAVOR+ attention;
2. wide sliding windows lost precision in float32 (differences of prefix sums);
3. FAVOR+ features dropped to bf16 under autocast;
6. the key-feature clamp at 80 changed the kernel and let sums overflow at large test-time R.
And every kernel keeps its sums in float32 under bf16 autocast.
"""

import math

import pytest
import torch

from spe.attention import MultiHeadAttention
from spe.encodings import RotaryEncoding
from spe.ops import (
    causal_linear_attention,
    favor_feature_map,
    linear_attention,
    linear_attention_step,
    orthogonal_random_features,
)


def _sharp_favor(spread, n=256, heads=2, dim=32, features=64):
    """FAVOR+ features of queries/keys whose q·k/√E has standard deviation ≈ ``spread``."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, n, heads, dim, generator=g) * math.sqrt(spread) for _ in range(2))
    w = orthogonal_random_features(heads, features, dim, generator=torch.Generator().manual_seed(1))
    return favor_feature_map(q, w, is_query=True), favor_feature_map(k, w, is_query=False)


@pytest.mark.parametrize("spread", [4.0, 6.0])
def test_all_ones_values_give_one_for_sharp_favor_attention(spread):
    # Any weighted mean of ones is 1: only float32 rounding may show (before: 0.17 at spread 6).
    fq, fk = _sharp_favor(spread)
    ones = torch.ones(1, fq.shape[1], 2, 8)
    outputs = {"causal": causal_linear_attention(fq, fk, ones),
               "non-causal": linear_attention(fq, fk, ones),
               "windowed": causal_linear_attention(fq, fk, ones, window=40, chunk_size=16)}
    state, steps = None, []
    for t in range(fq.shape[1]):
        y, state = linear_attention_step(fq[:, t:t + 1], fk[:, t:t + 1], ones[:, t:t + 1], state)
        steps.append(y)
    outputs["recurrent"] = torch.cat(steps, 1)
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
    single, state = causal_linear_attention(fq[:, :-2].float(), fk[:, :-2].float(), v[:, :-2].float(),
                                            window=window, chunk_size=c, output_final_state=True)
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
    # Keys x' = a·ω_j along the longest projection row: their logit ω_j·x' − ‖x'‖²/2 is
    # (a − a²/2)‖ω_j‖², 157 for a = 1 and 142 for a = 0.7 at E = 256, beyond the old clamp at 80.
    w = orthogonal_random_features(1, features, dim, generator=torch.Generator().manual_seed(0))
    j = w[0].norm(dim=-1).argmax()
    return w, torch.stack([w[0, j] * a * dim ** 0.25 for a in (1.0, 0.7)]).view(1, 2, 1, dim)


def test_favor_kernel_is_exact_for_keys_beyond_the_old_clamp():
    w, keys = _aligned_keys()
    query = keys[:, :1]
    got = torch.einsum("bqhm,bkhm->bk", favor_feature_map(query, w, is_query=True, eps=0.0),
                       favor_feature_map(keys, w, is_query=False))
    wd, kd = w.double(), keys.double() / keys.shape[-1] ** 0.25  # unstabilised features in float64
    raw = torch.exp(torch.einsum("bkhe,hme->bkhm", kd, wd) - 0.5 * (kd ** 2).sum(-1, keepdim=True))
    want = torch.einsum("bhm,bkhm->bk", raw[:, 0], raw)
    torch.testing.assert_close((got / got.sum()).double(), want / want.sum(), rtol=1e-4, atol=1e-6)


def test_favor_sums_do_not_overflow_at_large_test_time_r():
    # 4,096 keys at the clamp gave sums of 4096·e^80/8·|v| = 3e44 for |v| = 1e7: inf, then NaN.
    w, keys = _aligned_keys()
    keys = keys[:, :1].expand(1, 4096, 1, keys.shape[-1])
    fq, fk = favor_feature_map(keys, w, is_query=True), favor_feature_map(keys, w, is_query=False)
    y = causal_linear_attention(fq, fk, torch.full((1, 4096, 1, 2), 1e7))
    torch.testing.assert_close(y, torch.full_like(y, 1e7), rtol=1e-5, atol=0)


@pytest.mark.parametrize("attention,rotary", [("softmax", False), ("softmax", True), ("performer", False),
                                              ("performer", True), ("linear-elu", False), ("linear-relu", False)])
def test_attention_layer_keeps_float32_sums_under_bf16_autocast(attention, rotary):
    # Projections q = k = v = x/2 and an identity output are exact in bf16 for a bf16 input, so
    # under autocast only the roundings of the features, the rotation inputs and the output
    # (each 2⁻⁹ relative) may differ from float32: 2·2⁻⁸ of each row's scale. Summing the
    # 2,048 positions in bf16 instead gave 0.013 to 0.021 (checked by making the kernels' dtype
    # bf16 under autocast), and bf16 FAVOR+ features 0.018.
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 2, attention=attention, rotary=RotaryEncoding() if rotary else None,
                               num_features=32)
    with torch.no_grad():
        layer.qkv.weight.copy_(torch.cat([torch.eye(32)] * 3) * 0.5)
        layer.out.weight.copy_(torch.eye(32))
    x = torch.randn(1, 2048, 32).bfloat16().float()
    ref = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = layer(x)
    assert ((low.float() - ref).abs() / ref.abs().amax(-1, keepdim=True)).max() < 2 * 2 ** -8

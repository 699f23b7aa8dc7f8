"""Key padding masks in the non-causal kernels: masked keys are as if they were not there."""

import pytest
import torch

from spe.ops.common.feature_maps import (
    favor_feature_map,
    favor_key_features,
    orthogonal_random_features,
    relu_feature_map,
)
from spe.ops.linear import linear_attention
from spe.ops.softmax import softmax_attention


def _inputs(seed=0, n=9):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, n, 3, 4, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[0, 6:] = True
    mask[1, 3:] = True
    return q, k, v, mask


def test_linear_attention_with_masked_keys_equals_attention_over_the_real_keys_only():
    q, k, v, mask = _inputs()
    fq, fk = relu_feature_map(q), relu_feature_map(k)
    k_huge = fk.clone()
    k_huge[mask] = 1e6  # whatever padded keys hold
    out = linear_attention(fq, k_huge, v, key_padding_mask=mask)
    for b, real in enumerate((6, 3)):
        expected = linear_attention(fq[b:b + 1], fk[b:b + 1, :real], v[b:b + 1, :real])
        torch.testing.assert_close(out[b:b + 1], expected)


def test_favor_key_scales_of_padding_cannot_change_the_common_scale():
    # A padded key with a huge log scale would push every real key's weight e^{a_n − max a}
    # to 0 (0/0 outputs) if it took part in the maximum.
    q, k, v, mask = _inputs(1)
    projection = orthogonal_random_features(3, 8, 4, generator=torch.Generator().manual_seed(2)).double()
    k = k.clone()
    k[mask] = 40.0
    fq = torch.exp(torch.einsum("blhe,hme->blhm", q * 4 ** -0.25, projection))
    out = linear_attention(fq, favor_key_features(k, projection), v, key_padding_mask=mask)
    fk6 = favor_key_features(k[:1, :6], projection)
    torch.testing.assert_close(out[:1], linear_attention(fq[:1], fk6, v[:1, :6]))
    assert torch.isfinite(out).all()


def test_softmax_with_masked_keys_equals_softmax_over_the_real_keys_and_gives_them_no_gradient():
    q, k, v, mask = _inputs(3)
    k = k.clone().requires_grad_(True)
    out = softmax_attention(q, k, v, causal=False, key_padding_mask=mask)
    torch.testing.assert_close(out[1:], softmax_attention(q[1:], k[1:, :3], v[1:, :3], causal=False))
    out.sum().backward()
    assert k.grad[mask].abs().max() == 0 and k.grad[~mask].abs().max() > 0


@pytest.mark.parametrize("bad", [torch.zeros(2, 8, dtype=torch.bool), torch.zeros(2, 9)])
def test_a_mask_of_the_wrong_shape_or_type_is_refused(bad):
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match="key_padding_mask"):
        softmax_attention(q, k, v, causal=False, key_padding_mask=bad)
    with pytest.raises(ValueError, match="key_padding_mask"):
        linear_attention(relu_feature_map(q), relu_feature_map(k), v, key_padding_mask=bad)


def test_a_causal_softmax_refuses_a_padding_mask():
    q, k, v, mask = _inputs()
    with pytest.raises(ValueError, match="non-causal"):
        softmax_attention(q, k, v, causal=True, key_padding_mask=mask)


def _favor_reference(fq, fk, v, log_scale):
    """Σ_n (φ(q)·f_n) e^{a_n − max a} v_n / Σ_n (φ(q)·f_n) e^{a_n − max a} in float64, one example."""
    fq, fk, v, log_scale = (t.double() for t in (fq, fk, v, log_scale))
    w = torch.einsum("lhm,nhm->lhn", fq, fk) * torch.exp(log_scale - log_scale.amax(0))[None].permute(0, 2, 1)
    return torch.einsum("lhn,nhe->lhe", w, v) / w.sum(-1, keepdim=True)


def _far_keys(how):
    """FAVOR+ inputs (float32) whose real keys all have log scales below −10⁴: keys of norm 10³
    (−‖k'‖²/2 = −2.5·10⁵ dominates ω·k' ≈ ±10³) or a very negative log scale given directly."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 9, 3, 4, generator=g) for _ in range(3))
    projection = orthogonal_random_features(3, 8, 4, generator=g)
    fq = favor_feature_map(q, projection, is_query=True)
    if how == "huge keys":
        keys = favor_key_features(1e3 * k / k.norm(dim=-1, keepdim=True), projection)
        fk, log_scale = keys.features, keys.log_scale
    else:
        keys = favor_key_features(k, projection)
        fk, log_scale = keys.features, keys.log_scale - 2e4
    assert log_scale.max() < -1e4
    return fq, fk, v, log_scale


@pytest.mark.parametrize("how", ["huge keys", "direct"])
def test_padding_never_becomes_the_common_scale_of_keys_below_its_old_sentinel(how):
    # The padding log scale was −10⁴; once every real key's lies below it, padding set
    # the common scale, every real weight e^{a_n − (−10⁴)} underflowed and the output was 0.
    fq, fk, v, log_scale = _far_keys(how)
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, 5:] = True
    padded = linear_attention(fq, fk, v, key_log_scale=log_scale, key_padding_mask=mask)
    alone = linear_attention(fq[:1], fk[:1, :5], v[:1, :5], key_log_scale=log_scale[:1, :5])
    reference = _favor_reference(fq[0], fk[0, :5], v[0, :5], log_scale[0, :5])
    # float32 against float64: rounding of sums over M + L ≈ 17 terms, ≈ 17·2⁻²³ ≈ 2·10⁻⁶ of
    # the largest value, with a margin of 5
    tol = dict(rtol=1e-5, atol=1e-5 * float(reference.abs().max()))
    torch.testing.assert_close(padded[0].double(), reference, **tol)
    torch.testing.assert_close(padded[:1], alone, **tol)
    torch.testing.assert_close(padded[1].double(), _favor_reference(fq[1], fk[1], v[1], log_scale[1]), **tol)


def test_an_example_of_padding_only_gives_zeros_not_nan():
    fq, fk, v, log_scale = _far_keys("direct")
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[1] = True
    out = linear_attention(fq, fk, v, key_log_scale=log_scale, key_padding_mask=mask)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out[:1], linear_attention(fq[:1], fk[:1], v[:1], key_log_scale=log_scale[:1]))

"""Key padding masks in the non-causal kernels: masked keys are as if they were not there."""

import pytest
import torch

from spe.ops.feature_maps import favor_key_features, orthogonal_random_features, relu_feature_map
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
    fk, log_scale = favor_key_features(k, projection)
    out = linear_attention(fq, fk, v, key_log_scale=log_scale, key_padding_mask=mask)
    fk6, ls6 = favor_key_features(k[:1, :6], projection)
    torch.testing.assert_close(out[:1], linear_attention(fq[:1], fk6, v[:1, :6], key_log_scale=ls6))
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

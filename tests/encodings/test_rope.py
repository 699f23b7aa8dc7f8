"""RoPE: scores depend on m − n only, for softmax and RoFormer's linear-attention form."""

import pytest
import torch

from spe.attention import MultiHeadAttention
from spe.encodings import RotaryEncoding, rotate
from spe.ops import (
    causal_linear_attention,
    causal_linear_attention_reference,
    elu_feature_map,
    linear_attention,
)


def _x(n, seed=0, e=8):
    return torch.randn(2, n, 3, e, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_rotated_scores_depend_only_on_the_offset():
    q, k = _x(10, 0), _x(10, 1)
    pos = torch.arange(10, dtype=torch.float64) * 0.75
    scores = torch.einsum("bihe,bjhe->bhij", rotate(q, pos), rotate(k, pos))
    shifted = torch.einsum("bihe,bjhe->bhij", rotate(q, pos + 1000.25), rotate(k, pos + 1000.25))
    torch.testing.assert_close(shifted, scores, atol=1e-10, rtol=0)
    plain = torch.einsum("bihe,bjhe->bhij", q, k)
    assert (scores - plain).abs().max() > 1e-2  # the rotation does change the scores


def test_rotation_preserves_norms_and_rejects_odd_dimensions():
    x = _x(5)
    torch.testing.assert_close(rotate(x, torch.arange(5)).norm(dim=-1), x.norm(dim=-1))
    with pytest.raises(ValueError, match="even"):
        rotate(_x(5, e=5), torch.arange(5))
    with pytest.raises(ValueError, match=r"\(5,\)"):
        rotate(x, torch.arange(4))


@pytest.mark.parametrize("n,chunk", [(1, 4), (13, 4), (16, 8)])
def test_linear_attention_with_separate_normaliser_chunked_equals_reference_and_explicit(n, chunk):
    g = torch.Generator().manual_seed(n)
    fq, fk = (elu_feature_map(torch.randn(2, n, 3, 6, generator=g, dtype=torch.float64)) for _ in range(2))
    v = torch.randn(2, n, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(n)
    rq, rk = rotate(fq, pos), rotate(fk, pos)
    a = torch.einsum("bihm,bjhm->bhij", rq, rk).tril()
    den = torch.einsum("bihm,bjhm->bhij", fq, fk).tril().sum(-1).transpose(1, 2)[..., None]
    explicit = torch.einsum("bhij,bjhe->bihe", a, v) / den
    chunked = causal_linear_attention(rq, rk, v, chunk_size=chunk, normalizer=(fq, fk))
    ref = causal_linear_attention_reference(rq, rk, v, normalizer=(fq, fk))
    torch.testing.assert_close(chunked, explicit, atol=1e-10, rtol=0)
    torch.testing.assert_close(ref, explicit, atol=1e-10, rtol=0)
    ga = torch.autograd.grad(chunked.square().sum(), v)[0]
    gb = torch.autograd.grad(ref.square().sum(), v)[0]
    torch.testing.assert_close(ga, gb, atol=1e-10, rtol=0)
    full = linear_attention(rq, rk, v, normalizer=(fq, fk))
    a_full = torch.einsum("bihm,bjhm->bhij", rq, rk)
    den_full = torch.einsum("bihm,bjhm->bhij", fq, fk).sum(-1).transpose(1, 2)[..., None]
    torch.testing.assert_close(full, torch.einsum("bhij,bjhe->bihe", a_full, v) / den_full,
                               atol=1e-10, rtol=0)


@pytest.mark.parametrize("attention", ["softmax", "performer", "linear-elu"])
def test_layer_output_is_invariant_to_shifting_all_positions(attention):
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, attention=attention, positional=RotaryEncoding(), num_features=8).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    with torch.no_grad():
        a = layer(x, positions=torch.arange(11))
        b = layer(x, positions=torch.arange(11) + 537)
        c = layer(x, positions=torch.arange(11) * 2)
    torch.testing.assert_close(b, a, atol=1e-9, rtol=0)
    assert (c - a).abs().max() > 1e-4  # other offsets, other outputs


def test_rope_needs_an_even_feature_dimension():
    with pytest.raises(ValueError, match="even num_features"):
        MultiHeadAttention(16, 2, attention="performer", positional=RotaryEncoding(), num_features=7)


def test_linear_layer_follows_roformer_eq_19_with_weights_recomputed_by_hand():
    torch.manual_seed(1)
    layer = MultiHeadAttention(8, 2, attention="linear-elu", positional=RotaryEncoding(base=100.0)).double()
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    with torch.no_grad():
        out = layer(x)
        q, k, v = (x @ layer.qkv.weight.T).view(1, 6, 3, 2, 4).unbind(2)
        fq, fk = elu_feature_map(q), elu_feature_map(k)
        pos = torch.arange(6)
        num = torch.einsum("bihm,bjhm->bhij", rotate(fq, pos, base=100.0), rotate(fk, pos, base=100.0)).tril()
        den = torch.einsum("bihm,bjhm->bhij", fq, fk).tril().sum(-1)  # unrotated, positive
        y = torch.einsum("bhij,bjhe->bihe", num, v) / den.transpose(1, 2)[..., None]
        torch.testing.assert_close(out, y.reshape(1, 6, 8) @ layer.out.weight.T, atol=1e-10, rtol=0)

"""LRPE (cosine form): its angles, its far-position precision, its options and state dict."""

import math

import pytest
import torch

from spe.attention import MultiHeadAttention
from spe.encodings import LRPE
from spe.encodings.lrpe import lrpe_angles, lrpe_features
from spe.models import DecoderLM, ModelConfig


def test_fixed_angles_span_ropes_range_one_per_feature():
    theta = lrpe_angles(8)
    assert theta.dtype == torch.float64
    torch.testing.assert_close(theta, torch.tensor([10000.0 ** (-d / 8) for d in range(8)], dtype=torch.float64))


def test_products_are_cosines_of_the_lag_without_cross_terms():
    g = torch.Generator().manual_seed(0)
    fq, fk = torch.rand(1, 1, 1, 4, generator=g, dtype=torch.float64), torch.rand(1, 1, 1, 4, generator=g,
                                                                                      dtype=torch.float64)
    theta = torch.tensor([0.3, 1.1, 2.0, 0.01], dtype=torch.float64)
    m, n = 17, 5
    a = lrpe_features(fq, torch.tensor([m]), theta)
    b = lrpe_features(fk, torch.tensor([n]), theta)
    expected = sum(fq[0, 0, 0, d] * fk[0, 0, 0, d] * math.cos((m - n) * theta[d]) for d in range(4))
    torch.testing.assert_close((a * b).sum(), expected, atol=1e-14, rtol=0)


def test_phases_at_far_positions_keep_float32_precision():
    # m·θ in float32 would be off by ~m·6e-8 rad (0.06 rad at m = 10⁶); formed in float64 the
    # features at m and m + 10⁶ give products equal to float32 rounding (~1e-7)
    g = torch.Generator().manual_seed(1)
    fq, fk = torch.rand(1, 6, 2, 16, generator=g), torch.rand(1, 6, 2, 16, generator=g)
    theta = lrpe_angles(16)
    near = torch.einsum("bmhd,bnhd->bhmn", lrpe_features(fq, torch.arange(6), theta),
                        lrpe_features(fk, torch.arange(6), theta))
    far_pos = torch.arange(6) + 1_000_000
    far = torch.einsum("bmhd,bnhd->bhmn", lrpe_features(fq, far_pos, theta), lrpe_features(fk, far_pos, theta))
    torch.testing.assert_close(far, near, atol=2e-6, rtol=0)
    float32_phase = (far_pos.float()[:, None] * theta.float()).double()
    assert (float32_phase - far_pos.double()[:, None] * theta).abs().max() > 1e-3  # what float64 avoids


def test_learned_angles_start_at_the_fixed_ones_and_are_the_only_state():
    fixed, learned = LRPE(2, 8), LRPE(2, 8, angles="learned")
    assert list(fixed.state_dict()) == [] and list(learned.state_dict()) == ["angles"]
    assert learned.angles.shape == (2, 8)
    x, pos = torch.rand(3, 5, 2, 8), torch.arange(5) + 40
    torch.testing.assert_close(learned(x, pos), fixed(x, pos), atol=1e-6, rtol=0)


def test_options_are_checked():
    with pytest.raises(ValueError, match="lrpe_angles must be one of fixed, learned, got 'random'"):
        LRPE(2, 8, angles="random")
    with pytest.raises(ValueError, match="lrpe_angles must be one of fixed, learned, got 'random'"):
        ModelConfig(vocab_size=10, positional="lrpe", lrpe_angles="random")
    with pytest.raises(ValueError, match=r"angles of shape \(8,\) do not fit"):
        lrpe_features(torch.rand(1, 2, 2, 6), torch.arange(2), lrpe_angles(8))


def test_the_normaliser_keeps_untransformed_features_and_features_double():
    layer = MultiHeadAttention(16, 2, attention="performer", num_features=8, positional=LRPE(2, 8))
    assert layer.feature_sizes() == (16, 8)  # numerator 2M, normaliser M


def test_learned_angles_train_and_round_trip_through_the_state_dict():
    config = ModelConfig(vocab_size=20, d_model=16, num_heads=2, num_layers=1, d_ff=16, num_features=8,
                         positional="lrpe", lrpe_angles="learned")
    model = DecoderLM(config)
    tokens = torch.randint(0, 20, (2, 7), generator=torch.Generator().manual_seed(0))
    model.loss(tokens).backward()
    angles = model.blocks[0].attn.feature_transform.angles
    assert angles.grad is not None and angles.grad.abs().max() > 0
    again = DecoderLM(ModelConfig.from_dict(config.to_dict()))
    again.load_state_dict(model.state_dict())
    model.eval(), again.eval()
    with torch.no_grad():
        torch.testing.assert_close(again(tokens), model(tokens), atol=0, rtol=0)

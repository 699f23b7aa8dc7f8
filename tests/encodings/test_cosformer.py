"""cosFormer: non-negative weights within L_max, and a clear error beyond it."""

import math

import pytest
import torch

from spe.attention import MultiHeadAttention
from spe.checkpoint import max_positions
from spe.encodings import CosFormerReweighting
from spe.encodings.cosformer import cosformer_features
from spe.models import DecoderLM, ModelConfig


def test_products_are_reweighted_by_the_cosine_of_the_lag():
    g = torch.Generator().manual_seed(0)
    fq, fk = (torch.rand(1, 1, 1, 3, generator=g, dtype=torch.float64) for _ in range(2))
    a, b = cosformer_features(fq, torch.tensor([90]), 100), cosformer_features(fk, torch.tensor([7]), 100)
    expected = (fq * fk).sum() * math.cos(math.pi / 2 * (90 - 7) / 100)
    torch.testing.assert_close((a * b).sum(), expected, atol=1e-14, rtol=0)


def test_weights_are_non_negative_for_every_pair_within_l_max():
    fq = torch.rand(1, 50, 1, 4, dtype=torch.float64)
    f = cosformer_features(fq, torch.arange(50), 50)
    weights = torch.einsum("bmhd,bnhd->bmn", f, f)
    assert weights.min() >= 0
    assert weights[0, 49, 0] < 0.04 * weights.max()  # at lag L_max − 1 the cosine is nearly 0


def test_positions_beyond_l_max_raise_naming_l_max_and_the_position():
    t = CosFormerReweighting(16)
    with pytest.raises(ValueError, match=r"cosFormer .*L_max = 16 .*got position 16"):
        t(torch.rand(1, 17, 2, 4), torch.arange(17))
    with pytest.raises(ValueError, match="got position -1"):
        t(torch.rand(1, 2, 2, 4), torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match="max_length must be a positive integer, got 0"):
        CosFormerReweighting(0)


def test_layers_and_models_refuse_positions_beyond_l_max_in_forward_and_decoding():
    layer = MultiHeadAttention(8, 2, attention="linear-relu", positional=CosFormerReweighting(4))
    with pytest.raises(ValueError, match="L_max = 4 .* got position 4"):
        layer(torch.rand(1, 5, 8))
    state = None
    for _ in range(4):
        _, state = layer.step(torch.rand(1, 1, 8), None, state)
    with pytest.raises(ValueError, match="L_max = 4 .* got position 4"):
        layer.step(torch.rand(1, 1, 8), None, state)
    config = ModelConfig(vocab_size=10, d_model=8, num_heads=2, num_layers=1, d_ff=8, positional="cosformer",
                         attention="linear-relu", max_positions=6)
    assert max_positions(config) == 6  # L_max defaults to max_positions
    with pytest.raises(ValueError, match="L_max = 6"):
        DecoderLM(config)(torch.zeros(1, 7, dtype=torch.long))
    wider = ModelConfig(**{**config.to_dict(), "cosformer_max_length": 12})
    assert max_positions(wider) == 12
    assert DecoderLM(wider)(torch.zeros(1, 7, dtype=torch.long)).shape == (1, 7, 10)
    with pytest.raises(ValueError, match="cosformer_max_length must be a positive integer, got 0"):
        ModelConfig(**{**config.to_dict(), "cosformer_max_length": 0})


@pytest.mark.slow
def test_no_state_dict_entries():
    model = DecoderLM(ModelConfig(vocab_size=10, d_model=8, num_heads=2, num_layers=1, d_ff=8,
                                  positional="cosformer"))
    assert not [k for k in model.state_dict() if "feature_transform" in k]

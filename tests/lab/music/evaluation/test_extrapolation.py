"""Per-position cross-entropy: teacher forcing, explicit SPE codes per draw, bucket means."""

import math

import pytest
import torch
import torch.nn.functional as F

from spe import DecoderLM, ModelConfig
from spe.lab.music.evaluation.extrapolation import bucket_means, per_position_cross_entropy


def _model():
    torch.manual_seed(0)
    return DecoderLM(ModelConfig(vocab_size=20, d_model=16, num_layers=1, num_heads=2, d_ff=32,
                                 num_realizations=4, code_seed=3)).eval()


def _ce_with_code(model, x, seed):
    logits = model(x[:, :-1], generator=torch.Generator().manual_seed(seed))
    return F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none").double()


def test_draws_average_probabilities_over_explicit_codes_and_leave_the_model_alone():
    model = _model()
    x = torch.randint(0, 20, (3, 13), generator=torch.Generator().manual_seed(1))
    one = per_position_cross_entropy(model, x, batch_size=2)
    assert one.shape == (3, 12)
    torch.testing.assert_close(one.double(), _ce_with_code(model, x, 3), rtol=1e-5, atol=1e-6)  # the eval code
    two = per_position_cross_entropy(model, x, batch_size=2, num_draws=2)
    # -log of the mean probability under the codes of seeds 3 and 4 (float64 reference)
    expected = -(torch.logaddexp(-_ce_with_code(model, x, 3), -_ce_with_code(model, x, 4)) - math.log(2))
    torch.testing.assert_close(two.double(), expected, rtol=1e-5, atol=1e-6)
    assert model.config.code_seed == 3  # no side channel through the config
    other = per_position_cross_entropy(model, x, code_seed=7)
    torch.testing.assert_close(other.double(), _ce_with_code(model, x, 7), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(other, one)
    with pytest.raises(ValueError, match="num_draws"):
        per_position_cross_entropy(model, x, num_draws=0)


def test_bucket_means_cover_every_position_once():
    ce = torch.arange(10.0).repeat(2, 1)
    ce[1] += 1
    buckets = bucket_means(ce, 4)
    assert [(b["start"], b["end"], b["n"]) for b in buckets] == [(0, 4, 2), (4, 8, 2), (8, 10, 2)]
    assert [b["ce"] for b in buckets] == [2.0, 6.0, 9.0]
    assert buckets[0]["std"] == pytest.approx(math.sqrt(0.5))  # per-sequence means 1.5 and 2.5

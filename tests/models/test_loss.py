import math

import pytest
import torch

from spe.models.loss import cross_entropy


def test_cross_entropy_equals_negative_log_softmax_in_float64():
    gen = torch.Generator().manual_seed(0)
    logits = 30 * torch.randn(3, 5, 11, generator=gen, dtype=torch.float64)  # sharp distributions
    targets = torch.randint(11, (3, 5), generator=gen)
    expected = -torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    per_token = cross_entropy(logits.float(), targets, reduction="none")
    assert per_token.shape == (3, 5)
    # float32 log-sum-exp of logits up to ~100: relative rounding ~1e-7 of the logits' size
    torch.testing.assert_close(per_token.double(), expected, rtol=0, atol=1e-4)
    assert math.isclose(float(cross_entropy(logits.float(), targets)), float(expected.mean()), abs_tol=1e-4)
    assert math.isclose(float(cross_entropy(logits.float(), targets, reduction="sum")), float(expected.sum()),
                        abs_tol=1e-3)


def test_half_precision_logits_are_upcast_before_the_log_sum_exp():
    gen = torch.Generator().manual_seed(1)
    logits = (8 * torch.randn(4, 300, generator=gen)).bfloat16()
    targets = torch.randint(300, (4,), generator=gen)
    exact = -torch.log_softmax(logits.double(), -1).gather(-1, targets[:, None])[:, 0]
    assert cross_entropy(logits, targets, reduction="none").dtype == torch.float32
    torch.testing.assert_close(cross_entropy(logits, targets, reduction="none").double(), exact, rtol=0, atol=1e-5)


def test_mismatched_shapes_are_refused_with_both_shapes_named():
    with pytest.raises(ValueError, match=r"\(2, 3, 7\).*\(2, 4\)"):
        cross_entropy(torch.zeros(2, 3, 7), torch.zeros(2, 4, dtype=torch.long))


def test_a_target_of_minus_100_adds_nothing_and_the_mean_is_over_the_others():
    logits = torch.tensor([[0.0, math.log(3.0)], [5.0, 0.0], [math.log(3.0), 0.0]])
    targets = torch.tensor([1, -100, 0])
    # −log(3/4) twice, the middle position ignored
    assert cross_entropy(logits, targets).item() == pytest.approx(-math.log(0.75), rel=1e-6)
    assert cross_entropy(logits, targets, reduction="none")[1].item() == 0.0

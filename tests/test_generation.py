"""Nucleus sampling keeps exactly the top-p mass; masks and temperature are honoured."""

import pytest
import torch

from spe.generation import nucleus_filter, sample_next


def test_nucleus_keeps_smallest_set_reaching_p():
    probs = torch.tensor([0.05, 0.5, 0.3, 0.15])
    kept = torch.isfinite(nucleus_filter(probs.log(), 0.8))
    assert kept.tolist() == [False, True, True, False]  # 0.5 + 0.3 reaches 0.8
    kept = torch.isfinite(nucleus_filter(probs.log(), 0.81))
    assert kept.tolist() == [False, True, True, True]
    assert torch.isfinite(nucleus_filter(probs.log(), 1e-6)).sum() == 1
    with pytest.raises(ValueError, match="top_p"):
        nucleus_filter(probs, 0.0)


def test_sampling_respects_the_mask_and_frequencies():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    g = torch.Generator().manual_seed(0)
    allowed = torch.tensor([False, True, True])
    draws = [sample_next(logits, top_p=1.0, temperature=1.0, allowed=allowed, generator=g) for _ in range(2000)]
    assert 0 not in draws
    share = draws.count(1) / len(draws)  # renormalised: 0.75, binomial sd ≈ 0.0097
    assert abs(share - 0.75) < 4 * (0.75 * 0.25 / 2000) ** 0.5
    with pytest.raises(ValueError, match="temperature"):
        sample_next(logits, top_p=0.9, temperature=0.0, allowed=None, generator=g)

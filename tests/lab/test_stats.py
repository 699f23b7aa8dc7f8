"""The lab's one statistics convention (spe.lab.stats): mean ± sample std (n − 1) over seeds."""

import math

import pytest

from spe.lab.stats import SEED_SPREAD, format_mean_std, mean_and_std


def test_mean_and_sample_std_against_hand_computed_values():
    # [1, 2, 4]: mean 7/3; squared deviations 16/9 + 1/9 + 25/9 = 42/9; / (n − 1) = 2 → 7/3.
    mean, std = mean_and_std([1, 2, 4])
    assert mean == pytest.approx(7 / 3, rel=1e-15)
    assert std == pytest.approx(math.sqrt(7 / 3), rel=1e-15)
    # two values: the sample std is |a − b| / √2 (the population one would be |a − b| / 2)
    assert mean_and_std([30.0, 32.0])[1] == pytest.approx(math.sqrt(2), rel=1e-15)
    assert mean_and_std(iter([5.0, 5.0])) == (5.0, 0.0)  # any iterable; no spread is 0, not NaN


def test_one_value_has_no_spread_and_no_value_is_refused():
    mean, std = mean_and_std([0.25])
    assert mean == 0.25 and math.isnan(std)
    with pytest.raises(ValueError, match="at least one value"):
        mean_and_std([])


def test_the_formatter_writes_mean_plus_minus_std_or_a_dash():
    assert format_mean_std(25.5667, 0.9568) == "25.57 ± 0.96"
    assert format_mean_std(1.0654, 0.0493, digits=3) == "1.065 ± 0.049"
    assert format_mean_std(40.04, 16.44, digits=1, signed=True) == "+40.0 ± 16.4"
    assert format_mean_std(-0.43, 0.2, digits=1, signed=True) == "-0.4 ± 0.2"
    assert format_mean_std(20.0, math.nan) == "20.00 ± –"  # one seed, in memory
    assert format_mean_std(20.0, None, digits=1) == "20.0 ± –"  # one seed, read back from JSON (null)
    assert format_mean_std(*mean_and_std([1, 2, 4]), digits=4) == "2.3333 ± 1.5275"
    with pytest.raises(ValueError, match="digits must be ≥ 0, got -1"):
        format_mean_std(1.0, 0.1, digits=-1)


def test_the_header_phrase_names_the_convention():
    assert "sample std (n − 1)" in SEED_SPREAD and "– for one seed" in SEED_SPREAD

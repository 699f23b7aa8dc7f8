"""A learned clock's sum (spe.ops.sine.clock): τ_m = Σ_{0<t≤m} Δ_t in float64, continued from a
decoding state, against its float64 twin step by step."""

import pytest
import torch

from spe.ops.sine.clock import clock_times
from spe.ops.sine.naive import clock_reference


def test_clock_times_equal_the_reference_and_continue_where_they_stopped():
    g = torch.Generator().manual_seed(0)
    x, weight, bias = torch.randn(2, 7, 5, generator=g), torch.randn(3, 5, generator=g), torch.randn(3, generator=g)
    steps = torch.nn.functional.softplus(torch.einsum("blc,hc->blh", x, weight) + bias)  # (B, L, H)
    times, last = clock_times(steps)
    assert times.dtype == torch.float64 and (times[:, 0] == 0).all()
    torch.testing.assert_close(times, clock_reference(x, weight, bias), rtol=1e-6, atol=1e-6)
    head, state = clock_times(steps[:, :4])
    tail, end = clock_times(steps[:, 4:], state)
    torch.testing.assert_close(torch.cat([head, tail], 1), times, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(end, last, rtol=1e-12, atol=1e-12)


def test_a_clock_state_of_another_shape_is_refused():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4\)"):
        clock_times(torch.ones(2, 5, 3), torch.zeros(2, 4))

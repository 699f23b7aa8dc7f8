"""Inputs with no position or no example: an empty result of the right shape, or a
ValueError about the input, never an internal error (range() step 0, a None gate, a convolution wider
than its input, an ambiguous reshape)."""

import pytest
import torch

import spe

C, H = 16, 2


@pytest.mark.parametrize("attention,decay,short_conv", [
    ("linear-elu", "none", 0), ("performer", "none", 0), ("softmax", "none", 4), ("linear-elu", "gated", 0),
    ("performer", "fixed", 0), ("linear-elu", "gated-channel", 0), ("linear-elu", "gated-channel", 4),
    ("linear", "gated", 4)])
@pytest.mark.parametrize("batch,length", [(2, 0), (0, 5), (0, 0)])
def test_an_empty_input_gives_an_empty_output_with_gradients(attention, decay, short_conv, batch, length):
    layer = spe.MultiHeadAttention(C, H, attention=attention, decay=decay, short_conv=short_conv, causal=True)
    x = torch.randn(batch, length, C, requires_grad=True)
    y = layer(x)
    assert y.shape == (batch, length, C)
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_an_input_of_the_wrong_width_is_named():
    with pytest.raises(ValueError, match=r"x .*d_model = 16.*got shape \(2, 0, 8\)"):
        spe.MultiHeadAttention(C, H, attention="linear-elu")(torch.randn(2, 0, 8))


@pytest.mark.parametrize("decay", [None, "gate", "channel"])
def test_kernels_of_length_zero_return_empty_outputs(decay):
    q, v = torch.rand(2, 0, H, 4), torch.randn(2, 0, H, 3)
    gate = {None: None, "gate": -torch.rand(2, 0, H), "channel": -torch.rand(2, 0, H, 4)}[decay]
    assert spe.causal_linear_attention(q, q, v, log_decay=gate).shape == (2, 0, H, 3)
    assert spe.linear_attention(q, q, v, log_decay=gate).shape == (2, 0, H, 3)
    # queries but no key: no weight anywhere, zeros
    assert torch.equal(spe.linear_attention(torch.rand(2, 3, H, 4), q, v), torch.zeros(2, 3, H, 3))


def test_a_state_of_no_position_is_refused_and_an_initial_state_passed_on():
    q, v = torch.rand(1, 0, H, 4), torch.randn(1, 0, H, 3)
    with pytest.raises(ValueError, match=r"length 0 .*no final state"):
        spe.causal_linear_attention_with_state(q, q, v)
    one = torch.rand(1, 1, H, 4)
    _, state = spe.causal_linear_attention_with_state(one, one, torch.randn(1, 1, H, 3))
    y, after = spe.causal_linear_attention_with_state(q, q, v, initial_state=state)
    assert y.shape == (1, 0, H, 3) and after.position == 1 and torch.equal(after.kv, state.kv)

"""The kernels' shared pieces: the decay's named forms decoded once, the options
record, and the chunked form and recurrent step of linear attention behind one signature."""

import dataclasses
import inspect

import pytest
import torch

from spe.ops.decay.forms import ChannelGate, ConstantDecay, ScalarGate, decay_form, decode_decay, given_form
from spe.ops.linear_attn import LinearKernelOptions, chunk_linear_attention, recurrent_linear_attention

F64 = torch.float64
B, L, H, M, E = 2, 11, 3, 4, 5


def _tensors(seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.rand(B, L, H, M, generator=g, dtype=F64) for _ in range(2))
    v = torch.randn(B, L, H, E, generator=g, dtype=F64)
    forms = {"none": None,
             "constant": ConstantDecay(-0.3 * torch.rand(H, generator=g, dtype=F64)),
             "scalar": ScalarGate(-0.5 * torch.rand(B, L, H, 1, generator=g, dtype=F64)),
             "channel": ChannelGate(-0.5 * torch.rand(B, L, H, M, generator=g, dtype=F64))}
    return q, k, v, forms


def test_each_rank_of_log_decay_names_one_form():
    shape = (B, L, H, M)
    lam, scalar, channel = -torch.rand(H), -torch.rand(B, L, H), -torch.rand(B, L, H, M)
    assert decode_decay(None, shape) is None
    constant = decode_decay(lam, shape)
    assert isinstance(constant, ConstantDecay) and constant.log_decay is lam
    gate = decode_decay(scalar, shape)
    assert isinstance(gate, ScalarGate) and torch.equal(gate.gates, scalar[..., None])
    per_channel = decode_decay(channel, shape)
    assert isinstance(per_channel, ChannelGate) and per_channel.gates is channel
    # one channel is a scalar gate: the same algorithms run
    assert isinstance(decay_form(channel[..., :1]), ScalarGate)


def test_the_attention_registry_names_a_decay_by_its_form():
    # spe.attention reads a decay's form from spe.ops.decay.forms (given_form), never from its rank
    # itself: the kernel specs' decays and the layers' messages name the forms the kernels decode
    from spe.attention.kernels import DECAY_FORMS
    from spe.attention.kernels import decay_form as spec_form

    lam, scalar, channel = -torch.rand(H), -torch.rand(B, L, H), -torch.rand(B, L, H, M)
    given = [None, lam, scalar, channel, channel[..., :1], torch.zeros(B, L)]
    # a (B, L, H, 1) gate is a channel gate as given (a kernel spec's check), run as a scalar gate
    assert [given_form(t) for t in given] == [None, ConstantDecay, ScalarGate, ChannelGate, ChannelGate, None]
    assert [spec_form(t) for t in given] == [None, "constant", "gate", "channel", "channel", None]
    assert list(DECAY_FORMS) == [ConstantDecay.name, ScalarGate.name, ChannelGate.name]


@pytest.mark.parametrize("bad, message", [
    (torch.zeros(H + 1), "floating"),  # (H,) of another H
    (torch.zeros(B, L), "shape"),  # a rank no form has
    (torch.full((B, L, H), 0.5), "≤ 0"),  # a gate > 0
    (torch.full((H,), float("nan")), "finite"),
])
def test_decoding_refuses_what_no_form_accepts(bad, message):
    with pytest.raises(ValueError, match=message):
        decode_decay(bad, (B, L, H, M))


def test_a_channel_gate_refuses_key_scales_and_a_narrower_normaliser():
    channel = -torch.rand(B, L, H, M)
    with pytest.raises(ValueError, match="key_log_scale"):
        decode_decay(channel, (B, L, H, M), key_log_scale=True)
    with pytest.raises(ValueError, match="same dimension"):
        decode_decay(channel, (B, L, H, M), normalizer_features=M - 1)
    assert isinstance(decode_decay(-torch.rand(B, L, H), (B, L, H, M), key_log_scale=True), ScalarGate)


def test_the_options_record_is_frozen_and_takes_keywords_only():
    opts = LinearKernelOptions(chunk_size=8, window=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.window = 2
    with pytest.raises(TypeError):
        LinearKernelOptions(8)  # a positional option: refused
    assert dataclasses.replace(opts, window=None).chunk_size == 8


def test_the_chunked_form_and_the_step_share_one_signature():
    chunk, step = inspect.signature(chunk_linear_attention), inspect.signature(recurrent_linear_attention)
    assert list(chunk.parameters) == list(step.parameters) == ["phi_q", "phi_k", "v", "normalizer", "state", "opts"]


@pytest.mark.parametrize("form", ["none", "constant", "scalar", "channel"])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("normalize", [True, False])
def test_the_chunked_form_equals_its_recurrent_step(form, window, normalize):
    """One chunked call over L positions against L steps from the same options record: outputs
    and final state agree to float64 rounding (the two forms sum in different orders)."""
    q, k, v, forms = _tensors(seed=3)
    decay = forms[form]
    opts = LinearKernelOptions(chunk_size=4, window=window, normalize=normalize, position=L, decay=decay)
    y, state = chunk_linear_attention(q, k, v, None, None, opts)
    steps, s = [], None
    for t in range(L):
        one = decay if not isinstance(decay, (ScalarGate, ChannelGate)) else type(decay)(decay.gates[:, t:t + 1])
        out, s = recurrent_linear_attention(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], None, s,
                                            LinearKernelOptions(window=window, normalize=normalize, position=t + 1,
                                                                decay=one))
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), y, rtol=1e-12, atol=1e-12)
    assert type(s) is type(state) and s.position == state.position == L
    if window is None:
        torch.testing.assert_close(s.kv, state.kv, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(s.normalizer, state.normalizer, rtol=1e-12, atol=1e-12)
    else:
        torch.testing.assert_close(s.keys, state.keys, rtol=0, atol=0)


@pytest.mark.parametrize("case", ["causal", "full", "window", "padding", "fox", "fox-window", "constant-gate"])
def test_softmax_attention_equals_its_float64_reference_forward_and_backward(case):
    from spe.ops.softmax import softmax_attention, softmax_attention_reference

    g = torch.Generator().manual_seed(7)
    q, k = (torch.randn(B, L, H, 6, generator=g, dtype=F64).requires_grad_() for _ in range(2))
    v = torch.randn(B, L, H, E, generator=g, dtype=F64).requires_grad_()
    kwargs = {"causal": case != "full" and case != "padding"}
    if "window" in case:
        kwargs["window"] = 4
    if case == "padding":
        mask = torch.zeros(B, L, dtype=torch.bool)
        mask[0, -3:] = True  # the last keys of the first sequence are padding
        kwargs["key_padding_mask"] = mask
    if case.startswith("fox"):
        kwargs["log_decay"] = (-torch.rand(B, L, H, generator=g, dtype=F64)).requires_grad_()
    if case == "constant-gate":
        kwargs["log_decay"] = (-torch.rand(H, generator=g, dtype=F64)).requires_grad_()
    fast, slow = softmax_attention(q, k, v, **kwargs), softmax_attention_reference(q, k, v, **kwargs)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    leaves = [q, k, v] + ([kwargs["log_decay"]] if "log_decay" in kwargs else [])
    weight = torch.randn(fast.shape, generator=g, dtype=F64)
    for a, b in zip(torch.autograd.grad((fast * weight).sum(), leaves),
                    torch.autograd.grad((slow * weight).sum(), leaves), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    if case == "padding":  # padding keys get no weight: changing them changes nothing
        v2 = v.detach().clone()
        v2[0, -3:] = 1e3
        torch.testing.assert_close(softmax_attention_reference(q, k, v2, **kwargs), slow, rtol=0, atol=0)

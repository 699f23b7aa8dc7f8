"""Recurrent twins: chunked == step by step == reference, outputs and final states, forward and
backward (float64), for plain, RoPE-normalised and windowed linear attention and for softmax;
prefill with the chunked kernel then decode with steps equals one parallel pass."""

import pytest
import torch

from spe.ops import (
    KVCache,
    LinearAttentionState,
    causal_linear_attention,
    causal_linear_attention_reference,
    causal_linear_attention_with_state,
    elu_feature_map,
    linear_attention_step,
    softmax_attention,
    softmax_attention_step,
)


def _inputs(n, seed=0, normalizer=False, scaled=False):
    """φ(q), φ(k), v (and normaliser features); with ``scaled``, a key log scale spread over
    ±60 nats as well (FAVOR+ keys at a large R), last: float64 references stay exact."""
    g = torch.Generator().manual_seed(seed)
    tensors = [elu_feature_map(torch.randn(2, n, 3, 4, generator=g, dtype=torch.float64)),
               elu_feature_map(torch.randn(2, n, 3, 4, generator=g, dtype=torch.float64)),
               torch.randn(2, n, 3, 5, generator=g, dtype=torch.float64)]
    if normalizer:  # RoPE's form: signed numerator features, positive normaliser features
        tensors[:2] = [torch.randn(2, n, 3, 4, generator=g, dtype=torch.float64) for _ in range(2)]
        tensors += [elu_feature_map(torch.randn(2, n, 3, 6, generator=g, dtype=torch.float64)) for _ in range(2)]
    tensors = [t.requires_grad_() for t in tensors]
    if scaled:
        tensors.append(30 * torch.randn(2, n, 3, generator=g, dtype=torch.float64))
    return tensors


def _split(args):
    """(φq, φk, v) and the keyword arguments: normalizer, key_log_scale."""
    extra = {}
    if args[-1].dim() == 3:
        extra["key_log_scale"], args = args[-1], args[:-1]
    if len(args) > 3:
        extra["normalizer"] = tuple(args[3:])
    return args[:3], extra


def _at(extra, t):
    out = {}
    if "normalizer" in extra:
        out["normalizer"] = tuple(x[:, t:t + 1] for x in extra["normalizer"])
    if "key_log_scale" in extra:
        out["key_log_scale"] = extra["key_log_scale"][:, t:t + 1]
    return out


def _stepwise(args, window, state=None, start=0):
    (fq, fk, v), extra = _split(args)
    outs = []
    for t in range(start, fq.shape[1]):
        one = _at(extra, t)
        y, state = linear_attention_step(fq[:, t:t + 1], fk[:, t:t + 1], v[:, t:t + 1], state, window=window, **one)
        outs.append(y)
    return torch.cat(outs, dim=1), state


def _state_tensors(state):
    if state.window is None:
        return [state.kv, state.normalizer]
    return [x for x in (state.keys, state.values, state.normalizer_keys) if x is not None]


def _grads(args, y, extra_terms=()):
    args = [t for t in args if t.requires_grad]
    for t in args:
        t.grad = None
    loss = (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum()
    for s in extra_terms:
        loss = loss + (s * torch.linspace(0, 1, s.numel(), dtype=s.dtype).view_as(s)).sum()
    loss.backward()
    return [t.grad.clone() for t in args]


CASES = [(None, False, False), (None, True, False), (3, False, False), (5, True, False), (12, False, False),
         (40, False, False), (None, False, True), (None, True, True), (3, False, True), (9, True, True),
         (40, False, True)]


@pytest.mark.parametrize("window,normalizer,scaled", CASES)
def test_chunked_equals_steps_equals_reference_with_final_state(window, normalizer, scaled):
    args = _inputs(17, seed=1, normalizer=normalizer, scaled=scaled)
    (fq, fk, v), extra = _split(args)
    y_chunk, s_chunk = causal_linear_attention_with_state(fq, fk, v, chunk_size=4, window=window, **extra)
    g_chunk = _grads(args, y_chunk, _state_tensors(s_chunk))
    y_step, s_step = _stepwise(args, window)
    g_step = _grads(args, y_step, _state_tensors(s_step))
    y_ref = causal_linear_attention_reference(fq, fk, v, window=window, **extra)
    torch.testing.assert_close(y_chunk, y_ref)
    torch.testing.assert_close(y_step, y_ref)
    assert s_chunk.position == s_step.position == 17 and s_chunk.window == s_step.window == window
    for a, b in zip(_state_tensors(s_chunk), _state_tensors(s_step), strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(g_chunk, g_step):
        torch.testing.assert_close(a, b)
    if window is None:  # the final state is the plain sum over all keys (relative to e^{max a})
        weights = 1.0 if not scaled else torch.exp(extra["key_log_scale"] - s_chunk.log_scale[:, None])[..., None]
        torch.testing.assert_close(s_chunk.kv, torch.einsum("blhm,blhe->bhme", fk * weights, v))


@pytest.mark.parametrize("window,normalizer,scaled", CASES)
@pytest.mark.parametrize("split", [1, 6, 13])
def test_prefill_then_decode_or_continue_equals_one_pass(window, normalizer, scaled, split):
    args = [t.detach() for t in _inputs(19, seed=2, normalizer=normalizer, scaled=scaled)]
    (fq, fk, v), extra = _split(args)
    full = causal_linear_attention(fq, fk, v, chunk_size=4, window=window, **extra)
    head = [t[:, :split] for t in args]
    tail = [t[:, split:] for t in args]
    (hq, hk, hv), hextra = _split(head)
    y_head, state = causal_linear_attention_with_state(hq, hk, hv, chunk_size=4, window=window, **hextra)
    y_steps, _ = _stepwise(args, window, state=state, start=split)
    torch.testing.assert_close(torch.cat([y_head, y_steps], 1), full)
    (tq, tk, tv), textra = _split(tail)
    y_tail = causal_linear_attention(tq, tk, tv, chunk_size=4, window=window, initial_state=state, **textra)
    torch.testing.assert_close(torch.cat([y_head, y_tail], 1), full)


@pytest.mark.parametrize("window", [None, 1, 4, 30])
def test_softmax_steps_equal_the_causal_kernel_forward_and_backward(window):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 11, 3, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    y = softmax_attention(q, k, v, causal=True, window=window)
    gy = _grads((q, k, v), y)
    cache, outs = None, []
    for t in range(11):
        out, cache = softmax_attention_step(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], cache, window=window)
        outs.append(out)
    ys = torch.cat(outs, 1)
    gs = _grads((q, k, v), ys)
    torch.testing.assert_close(ys, y)
    for a, b in zip(gy, gs):
        torch.testing.assert_close(a, b)
    assert isinstance(cache, KVCache) and cache.position == 11
    assert cache.keys.shape[1] == (11 if window is None else min(window, 11))


def test_steps_refuse_a_state_of_another_window_and_several_positions():
    fq, fk, v = (t.detach() for t in _inputs(3))
    _, state = linear_attention_step(fq[:, :1], fk[:, :1], v[:, :1], window=4)
    with pytest.raises(ValueError, match="window 4"):
        linear_attention_step(fq[:, 1:2], fk[:, 1:2], v[:, 1:2], state)
    with pytest.raises(ValueError, match="one position"):
        linear_attention_step(fq, fk, v)
    with pytest.raises(ValueError, match="window None"):
        causal_linear_attention(fq, fk, v, window=2, initial_state=LinearAttentionState(
            kv=fk.new_zeros(2, 3, 4, 5), normalizer=fk.new_zeros(2, 3, 4)))


@pytest.mark.parametrize("window", [None, 6])
def test_steps_keep_float32_states_under_bf16_autocast(window):
    # bf16 inputs, autocast on: the step must compute as float32 does on the same inputs (the
    # output then rounded once to bf16), and carry a float32 state.
    fq, fk, v = (t.detach().float().bfloat16() for t in _inputs(40, seed=4))
    state32, state16 = None, None
    for t in range(40):
        one = [x[:, t:t + 1] for x in (fq, fk, v)]
        y32, state32 = linear_attention_step(*(x.float() for x in one), state32, window=window)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y16, state16 = linear_attention_step(*one, state16, window=window)
        assert y16.dtype == torch.bfloat16
        torch.testing.assert_close(y16.float(), y32, rtol=2 ** -8, atol=0)
    for a in ((state16.kv,) if window is None else (state16.keys, state16.values)):
        assert a.dtype == torch.float32

"""Typed decoding states: each holds only its own fields, none can be built inconsistent, and the
dicts of earlier versions convert to them."""

import pytest
import torch

from spe.ops import (
    AttentionState,
    KVCache,
    LinearAttentionState,
    RecentKeys,
    ScaledLinearAttentionState,
    ScaledRecentKeys,
    causal_linear_attention,
    causal_linear_attention_with_state,
)

B, H, M, E, T = 2, 3, 4, 5, 6


def _t(*shape):
    return torch.zeros(*shape)


def test_a_missing_required_field_fails_at_construction():
    with pytest.raises(TypeError):
        LinearAttentionState(kv=_t(B, H, M, E))  # no normaliser
    with pytest.raises(TypeError):
        ScaledLinearAttentionState(kv=_t(B, H, M, E), normalizer=_t(B, H, M))  # no log scale
    with pytest.raises(TypeError):
        RecentKeys(keys=_t(B, T, H, M), values=_t(B, T, H, E))  # no window
    with pytest.raises(TypeError):
        ScaledRecentKeys(keys=_t(B, T, H, M), values=_t(B, T, H, E), window=8, position=T)  # no log scales
    with pytest.raises(TypeError):
        KVCache(keys=_t(B, T, H, M))  # no values


@pytest.mark.parametrize("build", [
    lambda: LinearAttentionState(kv=_t(B, H, M, E), normalizer=_t(B, H + 1, M)),
    lambda: LinearAttentionState(kv=_t(B, H, M), normalizer=_t(B, H, M)),
    lambda: LinearAttentionState(kv=_t(B, H, M, E), normalizer=_t(B, H, M), position=-1),
    lambda: ScaledLinearAttentionState(kv=_t(B, H, M, E), normalizer=_t(B, H, M), log_scale=_t(B, 1)),
    lambda: RecentKeys(keys=_t(B, T, H, M), values=_t(B, T - 1, H, E), window=8, position=T),
    lambda: RecentKeys(keys=_t(B, T, H, M), values=_t(B, T, H, E), window=T - 1, position=T),  # more than W kept
    lambda: RecentKeys(keys=_t(B, T, H, M), values=_t(B, T, H, E), window=8, position=T - 1),  # more than seen
    lambda: RecentKeys(keys=_t(B, T, H, M), values=_t(B, T, H, E), window=0, position=T),
    lambda: RecentKeys(keys=_t(B, T, H, M), values=_t(B, T, H, E), window=None, position=T),
    lambda: RecentKeys(keys=_t(B, T, H, M), values=_t(B, T, H, E), window=8, position=T,
                       normalizer_keys=_t(B, T - 1, H, M)),
    lambda: ScaledRecentKeys(keys=_t(B, T, H, M), values=_t(B, T, H, E), window=8, position=T,
                             log_scales=_t(B, T, H + 1)),
    lambda: KVCache(keys=_t(B, T, H, M), values=_t(B, T, H + 1, E), position=T),
    lambda: KVCache(keys=_t(B, T, H, M), values=_t(B, T, H, E), position=T, window=T - 1),
])
def test_inconsistent_fields_are_refused(build):
    with pytest.raises(ValueError):
        build()


def test_states_are_immutable_and_the_scaled_ones_are_their_plain_kind():
    state = ScaledLinearAttentionState(kv=_t(B, H, M, E), normalizer=_t(B, H, M), log_scale=_t(B, H), position=3)
    with pytest.raises(AttributeError):
        state.position = 4
    assert isinstance(state, LinearAttentionState) and state.window is None
    recent = ScaledRecentKeys(keys=_t(B, T, H, M), values=_t(B, T, H, E), window=8, position=T,
                              log_scales=torch.arange(float(T)).view(1, T, 1).expand(B, T, H))
    assert isinstance(recent, RecentKeys) and recent.window == 8
    torch.testing.assert_close(recent.log_scale, torch.full((B, H), T - 1.0))
    for s in (state, recent, KVCache(keys=_t(B, T, H, M), values=_t(B, T, H, E), position=T)):
        assert isinstance(s, AttentionState)
        assert s.to(torch.float64).__class__ is s.__class__


@pytest.mark.parametrize("window,scaled,kind", [(None, False, LinearAttentionState),
                                                (None, True, ScaledLinearAttentionState),
                                                (3, False, RecentKeys), (3, True, ScaledRecentKeys)])
def test_the_kernel_returns_the_type_of_its_form_and_refuses_the_others(window, scaled, kind):
    g = torch.Generator().manual_seed(0)
    fq, fk = (torch.rand(B, 7, H, M, generator=g) for _ in range(2))
    v = torch.randn(B, 7, H, E, generator=g)
    extra = {"key_log_scale": torch.randn(B, 7, H, generator=g)} if scaled else {}
    y, state = causal_linear_attention_with_state(fq, fk, v, chunk_size=2, window=window, **extra)
    assert type(state) is kind and state.position == 7
    assert isinstance(causal_linear_attention(fq, fk, v, chunk_size=2, window=window, **extra), torch.Tensor)
    other = {} if scaled else {"key_log_scale": torch.zeros(B, 7, H)}
    with pytest.raises(ValueError, match="key_log_scale"):
        causal_linear_attention(fq, fk, v, window=window, initial_state=state, **other)
    with pytest.raises(ValueError, match="window"):
        causal_linear_attention(fq, fk, v, window=5 if window is None else None, initial_state=state, **extra)
    with pytest.raises(TypeError, match="KVCache"):
        causal_linear_attention(fq, fk, v, initial_state=KVCache(keys=fk, values=v, position=7))


def test_a_dict_state_is_refused_with_the_typed_state_named():
    from spe.attention import MultiHeadAttention

    layer = MultiHeadAttention(16, 2, attention="linear-elu")
    with pytest.raises(TypeError, match="decodes with a LinearAttentionState.*got dict"):
        layer.step(torch.randn(1, 1, 16), None, {"s": torch.zeros(1), "position": 4})



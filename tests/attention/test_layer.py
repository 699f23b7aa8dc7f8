"""The attention layer refuses impossible positional/kernel combinations at construction."""

import pytest
import torch

from spe.attention import MultiHeadAttention
from spe.encodings import ALiBi, PermuteFeatures, RotaryEncoding, ShawRelativePosition, SPEFilter
from spe.models import ModelConfig
from spe.ops import KVCache, LinearAttentionState


@pytest.mark.parametrize("attention", ["performer", "linear-relu", "linear-elu"])
def test_score_encodings_need_softmax(attention):
    with pytest.raises(ValueError, match="never forms"):
        MultiHeadAttention(16, 2, attention=attention, positional=ALiBi(2))


def test_the_one_positional_hook_keeps_each_module_where_it_acts_and_refuses_others():
    from spe.attention.layer import POSITIONAL_ROLES

    cases = {"spe_filter": SPEFilter(2, 8), "rotary": RotaryEncoding(), "score_encoding": ALiBi(2),
             "feature_transform": PermuteFeatures(2, 8)}
    attentions = {"score_encoding": "softmax", "feature_transform": "linear-elu"}
    for role, module in cases.items():
        layer = MultiHeadAttention(16, 2, attention=attentions.get(role, "performer"), positional=module,
                                   num_features=8)
        assert [getattr(layer, name) is module for name in POSITIONAL_ROLES] == [n == role for n in POSITIONAL_ROLES]
        assert any(key.startswith(role + ".") for key in layer.state_dict()) or not list(module.state_dict())
    with pytest.raises(TypeError, match="positional must be an SPEFilter, a RotaryEncoding, .*LayerEncoding.* got Linear"):
        MultiHeadAttention(16, 2, positional=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="non-causal"):
        MultiHeadAttention(16, 2, attention="softmax", causal=True, positional=ShawRelativePosition(8, 3,
                                                                                                     causal=False))


def test_rope_needs_even_dimensions_and_positive_features():
    with pytest.raises(ValueError, match="even head_dim"):
        MultiHeadAttention(15, 3, attention="softmax", positional=RotaryEncoding())
    with pytest.raises(ValueError, match="strictly positive"):
        MultiHeadAttention(16, 2, attention="linear-relu", positional=RotaryEncoding())
    with pytest.raises(ValueError, match="strictly positive"):
        ModelConfig(vocab_size=10, positional="rope", attention="linear-relu")


def test_score_encodings_refuse_positions_and_rope_states_need_their_position():
    layer = MultiHeadAttention(16, 2, attention="softmax", positional=ALiBi(2))
    with pytest.raises(ValueError, match="index distances"):
        layer(torch.zeros(1, 3, 16), positions=torch.arange(3))
    rope = MultiHeadAttention(16, 2, attention="linear-elu", positional=RotaryEncoding())
    with pytest.raises(TypeError, match="decodes with a LinearAttentionState or RecentKeys, got dict"):
        rope.step(torch.zeros(1, 1, 16), None, {"s": torch.zeros(1, 2, 8, 8), "z": torch.zeros(1, 2, 8)})


def test_steps_take_typed_states_of_their_kernel():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 16)
    soft = MultiHeadAttention(16, 2, attention="softmax")
    _, cache = soft.step(x[:, :1], None, None)
    assert isinstance(cache, KVCache) and cache.position == 1
    linear = MultiHeadAttention(16, 2, attention="performer", num_features=8)
    with pytest.raises(TypeError, match="LinearAttentionState"):
        linear.step(x[:, :1], None, cache)
    y0, state = linear.step(x[:, :1], None, None)
    assert isinstance(state, LinearAttentionState) and state.position == 1


def test_a_new_encoding_enters_the_layer_through_the_protocol_alone():
    # an encoding the layer has never heard of: its context from the input x, a decoding state of
    # its own, a hook on queries and keys; nothing in the layer names it
    from spe.encodings.spec import EncodingState, LayerEncoding

    class Scaled(LayerEncoding):
        stateful = True

        def prepare(self, x, positions, state=None, *, key_padding_mask=None):
            seen = (0 if state is None else state) + x.shape[1]
            return torch.sigmoid(x.mean(-1)), seen  # context (B, L): a scale per position

        def encode_queries_keys(self, q, k, *, code, context):
            return q * context[..., None, None], k

    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, attention="softmax", positional=Scaled())
    plain = MultiHeadAttention(16, 2, attention="softmax")
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(2, 5, 16)
    q, k, v = layer.project(x, None)
    q0, k0, v0 = plain.project(x, None)
    torch.testing.assert_close(q, q0 * torch.sigmoid(x.mean(-1))[..., None, None])
    assert torch.equal(k, k0) and torch.equal(v, v0)
    y = layer(x)
    assert (y - plain(x)).abs().max() > 1e-4
    state, steps = None, []
    for t in range(5):
        out, state = layer.step(x[:, t:t + 1], None, state)
        steps.append(out)
    assert isinstance(state, EncodingState) and state.encoding == 5 and state.position == 5
    torch.testing.assert_close(torch.cat(steps, 1), y, rtol=1e-5, atol=1e-6)


def test_an_encoding_that_forms_softmax_itself_may_take_the_layers_gate():
    # an encoding replacing softmax attention (as PaTH-FoX does) gets x through its context and the
    # layer's gate through its score term; the kernel then gets no gate of its own
    from spe.encodings.spec import ScoreEncoding
    from spe.ops.softmax import softmax_attention

    class OwnSoftmax(ScoreEncoding):
        causal = True
        takes_gate = True

        def score_term(self, context, log_decay=None):
            class Term:
                @staticmethod
                def attend(q, k, v, *, query_offset=0, key_padding_mask=None):
                    return softmax_attention(q, k, v, causal=True, log_decay=log_decay)
            return Term()

    torch.manual_seed(0)
    own = MultiHeadAttention(16, 2, attention="softmax", positional=OwnSoftmax(), decay="gated")
    fox = MultiHeadAttention(16, 2, attention="softmax", decay="gated")
    fox.load_state_dict(own.state_dict())
    x = torch.randn(2, 6, 16)
    torch.testing.assert_close(own(x), fox(x))
    with pytest.raises(ValueError, match="forms itself"):  # a term that does not take it is refused the gate
        MultiHeadAttention(16, 2, attention="softmax", positional=ALiBi(2), decay="gated")

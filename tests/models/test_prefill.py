"""DecoderLM.prefill: a prompt in one parallel pass gives the logits and the state of token-by-token steps."""

import pytest
import torch

from spe import DecoderLM, ModelConfig
from spe.attention import MultiHeadAttention

# One model per kind of attention state and positional hook: running sums (plain, FAVOR+
# scaled, decayed), recent keys (windows), KV caches (softmax, score terms), feature transforms.
KINDS = [
    {"positional": "sinespe", "attention": "performer"},
    {"positional": "sinespe", "attention": "performer", "attention_window": 7},
    {"positional": "ape", "attention": "softmax"},
    {"positional": "ape-learned", "attention": "softmax", "attention_window": 7},
    {"positional": "convspe", "attention": "linear-elu"},
    {"positional": "convspe", "attention": "linear-relu", "attention_window": 7, "gated": False},
    {"positional": "rope", "attention": "linear-elu", "attention_window": 7},
    {"positional": "shaw", "attention": "softmax"},
    {"positional": "alibi", "attention": "softmax"},
    {"positional": "sinespe-exact", "attention": "softmax"},
    {"positional": "cosformer", "attention": "linear-relu"},
    {"positional": "lrpe", "attention": "performer", "attention_window": 7},
    {"positional": "sinespe", "attention": "linear-elu", "decay": "learned"},
    {"positional": "none", "attention": "performer", "decay": "fixed", "attention_window": 7},
]


def _model(**kind):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, d_model=32, num_layers=2, num_heads=2, d_ff=64, dropout=0.0,
                      num_realizations=8, num_sines=2, kernel_size=6, num_features=16, chunk_size=8,
                      max_distance=6, max_positions=64, **kind)
    return DecoderLM(cfg).eval()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: "-".join(str(v) for v in k.values()))
def test_prefill_gives_the_logits_and_state_of_token_by_token_steps(kind):
    model = _model(**kind)
    x = torch.randint(0, 50, (2, 30), generator=torch.Generator().manual_seed(4))
    steps, state = [], None
    for t in range(30):
        logits, state = model.step(x[:, t], state)
        steps.append(logits)
    steps = torch.stack(steps, 1)
    prefilled, state = model.prefill(x[:, :20])
    assert prefilled.shape == (2, 20, 50) and state.position == 20
    torch.testing.assert_close(prefilled, steps[:, :20], atol=1e-5, rtol=1e-5)
    continued = []
    for t in range(20, 30):  # the state goes on as the one of 20 steps would
        logits, state = model.step(x[:, t], state)
        continued.append(logits)
    torch.testing.assert_close(torch.stack(continued, 1), steps[:, 20:], atol=1e-5, rtol=1e-5)


def test_prefill_refuses_an_empty_prompt_and_a_layer_that_is_not_causal():
    with pytest.raises(ValueError, match="at least one token"):
        _model(positional="ape", attention="softmax").prefill(torch.zeros(1, 0, dtype=torch.long))
    layer = MultiHeadAttention(8, 2, attention="softmax", causal=False)
    with pytest.raises(ValueError, match="not causal"):
        layer.prefill(torch.zeros(1, 3, 8), None)

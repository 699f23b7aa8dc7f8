"""Forget gates (``decay="gated"``, ``"gated-channel"``) and the normaliser-free ``linear`` kernel
through the layer and the models: decoding step by step and after a prefill equals the parallel
forward; the gate starts at RetNet's fixed decay; FoX and ``linear`` equal explicit float64
formulas; gate parameters are never weight-decayed; configs refuse impossible pairs; encoders
with gates ignore padding; checkpoints round-trip."""

import math

import pytest
import torch

from spe import checkpoint
from spe.attention.layer import MultiHeadAttention
from spe.encodings.gates import ChannelGate, ScalarGate
from spe.encodings.rope import RotaryEncoding
from spe.lab.lra.attention import cls_attention
from spe.models import ModelConfig
from spe.models.classifier_config import ClassifierConfig
from spe.models.decoder_lm import DecoderLM
from spe.models.encoder_classifier import EncoderClassifier
from spe.ops import causal_linear_attention
from spe.ops.decay import retnet_log_decay
from spe.lab.engine.optim import decayed_parameter_names, param_groups

TINY = {"d_model": 32, "num_layers": 2, "num_heads": 2, "d_ff": 64, "dropout": 0.0, "num_realizations": 8,
        "num_sines": 2, "num_features": 16, "chunk_size": 8}


def _stir_gates(model: torch.nn.Module, seed: int = 0) -> None:
    """Random gate weights, so that gates differ by position and head (at initialisation a
    ScalarGate's are RetNet's constants and would test nothing data-dependent)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, ScalarGate):
                module.weight.copy_(torch.randn(module.weight.shape, generator=g))
                module.log_rate.add_(torch.randn(module.log_rate.shape, generator=g))
            elif isinstance(module, ChannelGate):
                module.bias.copy_(2 * torch.randn(module.bias.shape, generator=g))
                module.up.mul_(4.0)


KINDS = [
    {"attention": "performer", "decay": "gated", "positional": "sinespe"},
    {"attention": "performer", "decay": "gated", "positional": "none", "attention_window": 7},
    {"attention": "linear-elu", "decay": "gated", "positional": "rope"},
    {"attention": "linear-elu", "decay": "gated", "positional": "permute"},
    {"attention": "linear", "decay": "gated", "positional": "sinespe", "attention_window": 7},
    {"attention": "linear", "decay": "gated", "positional": "none", "short_conv": 4},
    {"attention": "softmax", "decay": "gated", "positional": "none"},
    {"attention": "softmax", "decay": "gated", "positional": "rope", "attention_window": 7},
    {"attention": "softmax", "decay": "gated", "positional": "sinespe", "short_conv": 4},
    {"attention": "linear-elu", "decay": "gated-channel", "positional": "sinespe"},
    {"attention": "linear-elu", "decay": "gated-channel", "positional": "rope", "attention_window": 7},
    {"attention": "linear", "decay": "gated-channel", "positional": "none"},
    {"attention": "linear", "decay": "gated-channel", "positional": "rope", "short_conv": 4},
    {"attention": "linear", "decay": "gated-channel", "positional": "sinespe", "attention_window": 7},
    {"attention": "linear", "decay": "none", "positional": "rope"},
]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: "-".join(str(v) for v in k.values()))
def test_steps_and_prefill_equal_the_parallel_forward(kind):
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(vocab_size=40, **TINY, **kind)).eval()
    _stir_gates(model)
    x = torch.randint(0, 40, (2, 26), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(x)
        state, steps = None, []
        for t in range(26):
            logits, state = model.step(x[:, t], state)
            steps.append(logits)
        prefilled, state = model.prefill(x[:, :17])
        continued = []
        for t in range(17, 26):
            logits, state = model.step(x[:, t], state)
            continued.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(prefilled, full[:, :17], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(torch.stack(continued, 1), full[:, 17:], atol=2e-5, rtol=1e-5)


def test_the_scalar_gate_starts_at_retnets_fixed_decay():
    gate = ScalarGate(16, 4)
    x = 10 * torch.randn(3, 5, 16)
    g = gate(x)
    torch.testing.assert_close(g, retnet_log_decay(4).expand(3, 5, 4), rtol=1e-6, atol=0)
    g.sum().backward()  # at w = 0 the input still reaches w: the gate can learn to depend on it
    assert gate.weight.grad.abs().min() > 0 and gate.bias.grad.abs().min() > 0


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["performer", "linear-elu", "linear"])
@pytest.mark.parametrize("causal", [True, False])
def test_a_gated_model_at_initialisation_is_the_fixed_decay_model(attention, causal):
    def build(decay):
        torch.manual_seed(0)
        if causal:
            return DecoderLM(ModelConfig(vocab_size=40, positional="sinespe", attention=attention, decay=decay,
                                         **TINY)).eval()
        return EncoderClassifier(ClassifierConfig(vocab_size=40, num_classes=3, positional="rope",
                                                  attention=attention, decay=decay, **TINY)).eval()

    fixed, gated = build("fixed"), build("gated")
    missing = gated.load_state_dict(fixed.state_dict(), strict=False).missing_keys
    assert missing and all(".attn.decay_gate." in name for name in missing)
    x = torch.randint(2, 40, (2, 45), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(gated(x), fixed(x), atol=2e-5, rtol=1e-5)


def _by_hand_gates(layer: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """The gate from its parameters, written out: Mamba2's −softplus(wᵀx + b)·exp(A_log), or
    GLA's logsigmoid(W₂W₁x + b)/16 (pairs tied under RoPE)."""
    gate = layer.decay_gate
    if isinstance(gate, ScalarGate):
        z = x @ gate.weight.double().T + gate.bias.double()
        return -torch.log1p(torch.exp(z)) * torch.exp(gate.log_rate.double())
    z = (x @ gate.down.double().T) @ gate.up.double().T + gate.bias.double()
    g = -torch.log1p(torch.exp(-z)) / 16.0
    return g.view(*x.shape[:2], layer.num_heads, -1).repeat_interleave(gate.tied, -1)


def _log_weights(gates: torch.Tensor, causal: bool, window: int | None) -> torch.Tensor:
    """log w_mn = Σ of the gates strictly after min(m, n) up to max(m, n), by explicit sums over
    the positions between (−∞ outside the causal window): (B, H, L, L, G)."""
    g = gates if gates.dim() == 4 else gates[..., None]
    b, n, h, c = g.shape
    out = torch.full((b, h, n, n, c), -math.inf, dtype=torch.float64)
    for m in range(n):
        for k in range(n):
            if causal and (k > m or (window is not None and m - k >= window)):
                continue
            lo, hi = min(m, k), max(m, k)
            out[:, :, m, k] = g[:, lo + 1:hi + 1].sum(dim=1)
    return out


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("rope", [False, True])
def test_fox_equals_an_explicit_float64_softmax_with_the_gate_sums(window, rope):
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, attention="softmax", decay="gated", window=window,
                               positional=RotaryEncoding() if rope else None).double()
    _stir_gates(layer)
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    q, k, v = layer.project(x, None)
    if rope:
        q, k = layer.rotary(q, torch.arange(11)), layer.rotary(k, torch.arange(11))
    bias = _log_weights(_by_hand_gates(layer, x), True, window)[..., 0]  # (B, H, L, L)
    logits = torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(q.shape[-1]) + bias
    y = torch.einsum("bhmn,bnhd->bmhd", logits.softmax(-1), v)
    torch.testing.assert_close(layer(x), layer.out(y.flatten(2)), atol=1e-10, rtol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("decay", ["none", "fixed", "gated", "gated-channel"])
@pytest.mark.parametrize("causal,window", [(True, None), (True, 5), (False, None)])
def test_the_linear_kernel_is_the_unnormalised_sum_then_an_rms_norm(decay, causal, window):
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, attention="linear", decay=decay, causal=causal, window=window,
                               chunk_size=4).double()
    _stir_gates(layer)
    with torch.no_grad():
        layer.output_norm.weight.copy_(torch.linspace(0.5, 2.0, 8))  # learnable, one per head_dim channel
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    q, k, v = layer.project(x, None)
    n = torch.arange(13)
    if decay == "none":
        log_w = _log_weights(torch.zeros(2, 13, 2, dtype=torch.float64), causal, window)
    elif decay == "fixed":
        lag = (n[:, None] - n[None, :]).abs().double()
        log_w = (lag[None, None] * layer.log_decay().double()[None, :, None, None])[..., None]  # RetNet's
        log_w = log_w.expand(2, -1, -1, -1, -1).masked_fill(
            _log_weights(torch.zeros(2, 13, 2, dtype=torch.float64), causal, window) == -math.inf, -math.inf)
    else:
        log_w = _log_weights(_by_hand_gates(layer, x), causal, window)
    scores = torch.einsum("bmhd,bnhd,bhmnd->bhmn", q, k, log_w.exp().expand(-1, -1, -1, -1, q.shape[-1]))
    y = torch.einsum("bhmn,bnhd->bmhd", scores, v)  # no denominator
    y = y / torch.sqrt(y.square().mean(-1, keepdim=True) + 1e-5) * layer.output_norm.weight
    torch.testing.assert_close(layer(x), layer.out(y.flatten(2)), atol=1e-9, rtol=1e-9)


def test_normaliser_free_sums_refuse_a_normaliser_and_key_scales():
    q = k = v = torch.randn(1, 4, 2, 3)
    with pytest.raises(ValueError, match="normalize=False gives the numerator .* no key_log_scale"):
        causal_linear_attention(q, k, v, normalize=False, key_log_scale=torch.zeros(1, 4, 2))
    with pytest.raises(ValueError, match="takes no separate normalizer"):
        causal_linear_attention(q, k, v, normalize=False, normalizer=(q, k))


@pytest.mark.parametrize("decay", ["gated", "gated-channel"])
def test_gate_parameters_are_positional_and_never_weight_decayed(decay):
    model = DecoderLM(ModelConfig(vocab_size=30, attention="linear", decay=decay, **TINY))
    named = dict(model.named_parameters())
    gates = [n for n in named if ".attn.decay_gate." in n]
    assert len(gates) == 2 * 3  # (w, b, A_log) or (W₁, W₂, b) in each of the 2 layers
    norms = [n for n in named if n.endswith("attn.output_norm.weight")]
    assert len(norms) == 2 and named[norms[0]].shape == (16,)  # head_dim
    assert not set(gates + norms) & set(decayed_parameter_names(model))
    _, _, scaled = param_groups(model, 0.1, positional_lr_scale=2.0)
    assert {id(named[n]) for n in gates} <= {id(p) for p in scaled["params"]}


@pytest.mark.parametrize("options,message", [
    ({"attention": "softmax", "decay": "gated-channel"},
     "decay 'gated-channel' .*softmax.*linear-relu, linear-elu, linear, or decay 'none'"),
    ({"attention": "performer", "decay": "gated-channel"},
     r"FAVOR\+ .*log scale per key.*performer attention .*feature channel"),
    ({"attention": "softmax", "decay": "gated", "positional": "alibi"},
     "decay 'gated' .*FoX.*positional 'alibi'"),
    ({"attention": "linear-elu", "decay": "gated-channel", "positional": "permute"},
     "decay 'gated-channel' .*positional 'permute'"),
])
def test_configs_refuse_what_a_gate_cannot_do(options, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(vocab_size=10, **options)


def test_an_encoder_takes_gates_on_linear_kernels_but_not_fox():
    with pytest.raises(ValueError, match="softmax .*encoder.*use attention performer"):
        ClassifierConfig(vocab_size=10, attention="softmax", decay="gated", positional="none")


@pytest.mark.parametrize("attention,decay", [("linear-elu", "gated"), ("linear", "gated-channel"),
                                             ("performer", "gated")])
@pytest.mark.slow
def test_an_encoder_with_gates_runs_and_ignores_padding(attention, decay):
    torch.manual_seed(0)
    model = EncoderClassifier(ClassifierConfig(vocab_size=30, num_classes=3, attention=attention, decay=decay,
                                               positional="sinespe", short_conv=4, **TINY)).eval()
    _stir_gates(model)
    tokens = torch.randint(2, 30, (1, 12), generator=torch.Generator().manual_seed(3))
    padded = torch.cat([tokens, torch.randint(2, 30, (1, 5))], dim=1)
    with torch.no_grad():
        a = model(tokens)
        b = model(padded, lengths=torch.tensor([12]))
    assert a.shape == (1, 3) and torch.isfinite(a).all()
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_a_gated_checkpoint_round_trips(tmp_path):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=30, attention="linear", decay="gated-channel", positional="rope", **TINY)
    assert ModelConfig.from_dict(config.to_dict()) == config
    model = DecoderLM(config).eval()
    _stir_gates(model)
    loaded = checkpoint.load(checkpoint.save(model, tmp_path / "model.safetensors")).model
    assert loaded.config.decay == "gated-channel" and loaded.config.attention == "linear"
    x = torch.randint(0, 30, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))


def test_the_gates_of_a_step_come_from_the_steps_input():
    """A gate is a function of its own position's input: changing one input changes the
    gates of that position only."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, attention="linear-elu", decay="gated-channel")
    _stir_gates(layer)
    x = torch.randn(1, 6, 16)
    y = x.clone()
    y[:, 3] += 1.0
    a, b = layer.log_decay(x), layer.log_decay(y)
    assert a.shape == (1, 6, 2, 8) and (a <= 0).all()
    changed = (a - b).abs().amax(dim=(0, 2, 3)) > 0
    assert changed.tolist() == [False, False, False, True, False, False]
    with pytest.raises(ValueError, match="decay 'gated-channel' .*layer's input"):
        layer.log_decay()


@pytest.mark.slow
@pytest.mark.parametrize("attention,decay", [("performer", "gated"), ("linear-elu", "gated-channel")])
def test_the_cls_attention_map_of_a_gated_encoder_is_what_its_layer_applies(attention, decay):
    torch.manual_seed(0)
    model = EncoderClassifier(ClassifierConfig(vocab_size=12, num_classes=3, attention=attention, decay=decay,
                                               positional="none", **TINY)).double().eval()
    _stir_gates(model)
    tokens = torch.randint(12, (3, 9), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([9, 5, 2])
    weights = cls_attention(model, tokens, lengths)  # (B, H, L)
    attn, seen = model.blocks[-1].attn, {}
    handle = attn.register_forward_hook(lambda m, args, out: seen.update(x=args[0], y=out))
    with torch.no_grad():
        model.encode(tokens, lengths)
    handle.remove()
    _, _, v = attn.project(seen["x"], None)
    expected = attn.out(torch.einsum("bhl,blhd->bhd", weights.double(), v).flatten(1))
    torch.testing.assert_close(seen["y"][:, 0], expected, rtol=0, atol=1e-6 * float(seen["y"][:, 0].abs().max()))

"""Decay through the layer, the models, the configs, the optimizer rule and the command line:
forward == step by step with RoPE (RetNet's scheme), SPE and none; the learned logits get
gradients and are never weight-decayed; softmax refuses a decay; old configs and state dicts
are unchanged."""

import pytest
import torch

from spe.attention.layer import MultiHeadAttention
from spe.encodings.rope import RotaryEncoding
from spe.models import ModelConfig
from spe.models.classifier_config import ClassifierConfig
from spe.models.decoder_lm import DecoderLM
from spe.models.encoder_classifier import EncoderClassifier
from spe.ops.decay import retnet_log_decay
from spe.lab.engine.optim import decayed_parameter_names, param_groups

SMALL = {"d_model": 16, "num_heads": 2, "num_layers": 2, "d_ff": 32}


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["performer", "linear-elu", "linear-relu"])
@pytest.mark.parametrize("decay", ["fixed", "learned"])
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("window", [None, 6])
def test_layer_forward_equals_steps(attention, decay, rope, window):
    if rope and attention == "linear-relu":
        pytest.skip("RoPE needs strictly positive features")
    torch.manual_seed(0)
    rotary = RotaryEncoding(64 if attention == "performer" else 8) if rope else None
    layer = MultiHeadAttention(32, 4, attention=attention, decay=decay, positional=rotary, chunk_size=4,
                               window=window).double()
    x = torch.randn(2, 19, 32, dtype=torch.float64)
    y = layer(x)
    state, steps = None, []
    for t in range(19):
        out, state = layer.step(x[:, t:t + 1], None, state)
        steps.append(out)
    assert torch.allclose(y, torch.cat(steps, 1), atol=1e-10, rtol=0)


@pytest.mark.slow
def test_decay_changes_the_output_and_learned_logits_get_gradients():
    torch.manual_seed(0)
    plain = MultiHeadAttention(32, 4, attention="performer")
    learned = MultiHeadAttention(32, 4, attention="performer", decay="learned")
    learned.load_state_dict(plain.state_dict(), strict=False)
    assert torch.allclose(learned.log_decay(), retnet_log_decay(4), rtol=1e-6, atol=0)  # initialised at RetNet's
    x = torch.randn(2, 40, 32)
    y = learned(x)
    assert not torch.allclose(y, plain(x))
    y.square().sum().backward()
    assert learned.decay_logit.grad is not None and torch.isfinite(learned.decay_logit.grad).all()
    assert learned.decay_logit.grad.abs().min() > 0


@pytest.mark.slow
def test_state_dict_keys_without_decay_are_unchanged():
    keys = set(MultiHeadAttention(32, 4).state_dict())
    assert set(MultiHeadAttention(32, 4, decay="fixed").state_dict()) == keys  # computed, not stored
    assert set(MultiHeadAttention(32, 4, decay="learned").state_dict()) == keys | {"decay_logit"}


@pytest.mark.slow
def test_softmax_and_unknown_decays_are_refused():
    with pytest.raises(ValueError, match="softmax .*decay"):
        MultiHeadAttention(32, 4, attention="softmax", decay="fixed")
    with pytest.raises(ValueError, match="decay must be one of none, fixed, learned, gated, gated-channel, got 'retnet'"):
        MultiHeadAttention(32, 4, decay="retnet")
    with pytest.raises(ValueError, match="decay 'learned' .*linear attention.*softmax"):
        ModelConfig(vocab_size=10, attention="softmax", positional="rope", decay="learned")
    with pytest.raises(ValueError, match="got 'yes'"):
        ClassifierConfig(vocab_size=10, num_classes=2, decay="yes")


def test_old_config_dicts_load_without_decay():
    old = ModelConfig(vocab_size=10).to_dict()
    assert "decay" not in old  # headers of models without decay are unchanged
    assert ModelConfig.from_dict(old).decay == "none"
    assert ModelConfig(vocab_size=10, decay="learned").to_dict()["decay"] == "learned"
    assert ModelConfig.from_dict({**old, "decay": "fixed"}).decay == "fixed"


@pytest.mark.slow
@pytest.mark.parametrize("positional", ["sinespe", "rope", "none", "ape"])
def test_decoder_with_decay_generates_as_it_trains(positional):
    """The whole model: forward logits == step-by-step logits (SPE, RoPE + decay = RetNet's scheme)."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=20, positional=positional, decay="fixed", dropout=0.0, chunk_size=4, **SMALL)
    model = DecoderLM(config).eval()
    tokens = torch.randint(0, 20, (2, 11))
    with torch.no_grad():
        full = model(tokens)
        state, steps = None, []
        for t in range(11):
            logits, state = model.step(tokens[:, t], state)
            steps.append(logits)
    # float32 logits of size O(1) after 2 blocks: a few hundred roundings of 2⁻²⁴, well under 1e-4
    assert torch.allclose(full, torch.stack(steps, 1), atol=1e-4, rtol=0)


def test_decay_logits_are_never_weight_decayed():
    """The engine's rule decays nn.Linear weights only: the (H,) logits go to the no-decay group."""
    for model in (DecoderLM(ModelConfig(vocab_size=30, decay="learned", **SMALL)),
                  EncoderClassifier(ClassifierConfig(vocab_size=30, num_classes=3, decay="learned", **SMALL))):
        logits = [n for n, _ in model.named_parameters() if n.endswith("decay_logit")]
        assert logits == ["blocks.0.attn.decay_logit", "blocks.1.attn.decay_logit"]
        assert not set(logits) & set(decayed_parameter_names(model))
        decay, rest = param_groups(model, 0.1)
        named = dict(model.named_parameters())
        assert all(any(p is named[n] for p in rest["params"]) for n in logits)
        assert not any(p is named[n] for p in decay["params"] for n in logits)


@pytest.mark.slow
def test_encoder_with_decay_ignores_padding():
    torch.manual_seed(0)
    config = ClassifierConfig(vocab_size=30, num_classes=3, decay="fixed", dropout=0.0, positional="none",
                              **SMALL)
    model = EncoderClassifier(config).eval()
    tokens = torch.randint(1, 30, (1, 12))
    padded = torch.cat([tokens, torch.randint(1, 30, (1, 5))], dim=1)
    with torch.no_grad():
        a = model(tokens)
        b = model(padded, lengths=torch.tensor([12]))
    assert torch.allclose(a, b, atol=1e-5, rtol=0)


def test_cli_decay_flag_reaches_the_config():
    from spe.lab.cli.main import _train_config, build_parser

    args = build_parser().parse_args(["train", "--decay", "learned", "--positional", "rope"])
    assert _train_config(args).model["decay"] == "learned"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--decay", "sometimes"])
    lra = build_parser().parse_args(["lra", "--task", "listops", "--decay", "fixed"])
    assert lra.decay == "fixed"

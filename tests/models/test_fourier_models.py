"""FNet in the models: the Fourier mixer in the attention's place (no q, k, v; the norms and the
feed-forward sublayer kept), the causal LM decoding by steps and prefill as its forward does,
the encoder's padding, the checkpoint's DFT length, and every option a mixer refuses."""

from __future__ import annotations

import pytest
import torch

from spe import ClassifierConfig, DecoderLM, EncoderClassifier, ModelConfig
from spe.attention.fourier import MIXERS, FourierMixer
from spe.checkpoint import load, save
from spe.ops import FourierState

SIZES = {"d_model": 32, "num_layers": 2, "num_heads": 2, "d_ff": 64, "dropout": 0.0}


def _lm(**options) -> DecoderLM:
    torch.manual_seed(0)
    options = {"positional": "ape", "attention": "fnet-causal", "fourier_length": 8, **options}
    return DecoderLM(ModelConfig(vocab_size=40, **SIZES, **options)).eval()


def _tokens(b=2, n=21, seed=0, vocab=40):
    return torch.randint(2, vocab, (b, n), generator=torch.Generator().manual_seed(seed))


def test_the_mixer_replaces_attention_and_keeps_norms_and_feed_forward():
    model = _lm()
    block = model.blocks[0]
    assert isinstance(block.attn, FourierMixer) and not list(block.attn.parameters())
    assert {name.split(".")[0] for name, _ in block.named_parameters()} == {"norm1", "norm2", "ffn"}
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(1))
    # the unitary scale: a pre-norm block adds F(norm(x)) to the residual stream unnormalised
    torch.testing.assert_close(FourierMixer("fnet")(x), torch.fft.fft2(x, norm="ortho").real)


@pytest.mark.parametrize("length", [8, 32])
def test_causal_lm_steps_and_prefill_give_its_forward(length):
    model = _lm(fourier_length=length)  # 21 tokens: beyond N = 8 and within N = 32
    x = _tokens()
    full = model(x)
    logits, state = model.prefill(x[:, :6])
    outs = [logits]
    for t in range(6, 21):
        step, state = model.step(x[:, t], state)
        outs.append(step[:, None])
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-4, atol=1e-4)
    assert isinstance(state.layers[0], FourierState) and state.layers[0].sums.shape == (2, length, 32)
    first, carried = model.forward_with_state(x[:, :10])
    torch.testing.assert_close(torch.cat([first, model.forward_with_state(x[:, 10:], carried)[0]], 1), full,
                               rtol=1e-4, atol=1e-4)


def test_causal_lm_future_tokens_change_no_logit():
    model = _lm()
    x = _tokens()
    changed = x.clone()
    changed[:, 12:] = _tokens(seed=5)[:, 12:]
    # up to float32 rounding: the FFT spreads every input's rounding error over all outputs
    torch.testing.assert_close(model(changed)[:, :12], model(x)[:, :12], rtol=0, atol=1e-5)
    assert (model(changed)[:, 12:] - model(x)[:, 12:]).abs().max() > 1e-3


def test_the_checkpoint_records_the_dft_length(tmp_path):
    model = _lm(fourier_length=12)
    loaded = load(save(model, tmp_path / "run")).model
    assert loaded.config.fourier_length == 12 and loaded.blocks[0].attn.length == 12
    x = _tokens()
    torch.testing.assert_close(loaded(x), model(x))
    assert "fourier_length" not in ModelConfig(vocab_size=40).to_dict()  # other headers unchanged


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_encoder_reads_each_sequence_as_if_unpadded(pooling):
    torch.manual_seed(0)
    model = EncoderClassifier(ClassifierConfig(vocab_size=40, num_classes=3, positional="ape", attention="fnet",
                                               pooling=pooling, **SIZES)).eval()
    tokens, lengths = _tokens(3, 12), torch.tensor([12, 7, 3])
    padded = model(tokens, lengths)
    alone = torch.cat([model(tokens[i:i + 1, :n]) for i, n in enumerate(lengths.tolist())])
    torch.testing.assert_close(padded, alone, rtol=1e-5, atol=1e-5)
    noise = tokens.clone()
    noise[1, 7:] = 5
    torch.testing.assert_close(model(noise, lengths), padded, rtol=0, atol=0)


@pytest.mark.parametrize("options,match", [
    ({"attention": "fnet"}, "'fnet-causal'"),
    ({"positional": "sinespe"}, "'sinespe'.*ape"),
    ({"positional": "rope"}, "'rope'"),
    ({"positional": "shaw"}, "'shaw'"),
    ({"positional": "lrpe"}, "'lrpe'"),
    ({"decay": "fixed"}, "decay"),
    ({"decay": "gated"}, "decay"),
    ({"short_conv": 4}, "short_conv"),
    ({"output_gate": True}, "output_gate"),
    ({"qk_norm": True}, "qk_norm"),
    ({"kv_shift": True}, "kv_shift"),
    ({"output_norm": True}, "output_norm"),
    ({"attention_window": 8}, "attention_window"),
    ({"attention_blocks": 4}, "attention_blocks"),
    ({"fourier_length": None}, "fourier_length.*None"),
    ({"fourier_length": 0}, "fourier_length.*0"),
    ({"attention": "softmax", "fourier_length": 8}, "fourier_length.*'softmax'"),
])
def test_a_decoder_mixer_refuses_what_it_cannot_take(options, match):
    base = {"positional": "ape", "attention": "fnet-causal", "fourier_length": 8}
    with pytest.raises(ValueError, match=match):
        ModelConfig(vocab_size=40, **{**base, **options})


@pytest.mark.parametrize("options,match", [
    ({"attention": "fnet-causal"}, "'fnet'"),
    ({"positional": "sinespe"}, "'sinespe'"),
    ({"decay": "fixed"}, "decay"),
])
def test_an_encoder_mixer_refuses_what_it_cannot_take(options, match):
    with pytest.raises(ValueError, match=match):
        ClassifierConfig(vocab_size=40, **{"positional": "ape", "attention": "fnet", **options})


def test_mixers_take_every_encoding_on_tokens_and_are_named_once():
    for positional in ("ape", "ape-learned", "none"):
        _lm(positional=positional, max_positions=64)(_tokens())
    assert set(MIXERS) == {"fnet", "fnet-causal"}
    with pytest.raises(ValueError, match="fnet, fnet-causal"):
        ModelConfig(vocab_size=40, attention="fourier")
    with pytest.raises(ValueError, match="window"):
        _lm().set_attention_window(8)

"""The short convolution of queries, keys and values (``short_conv``, fla's ShortConvolution):
the fast conv equals its float64 reference forward and backward and is causal; decoding
(step by step, prefill then steps) equals the parallel forward; encoders take a centred form
that padding never reaches; short_conv = 0 changes nothing; the weights are positional
parameters; configs and checkpoints carry the option, older ones load with 0."""

import pytest
import torch

from spe import checkpoint
from spe.attention.layer import MultiHeadAttention
from spe.encodings.short_conv import ShortConvState, check_short_conv, depthwise_conv, depthwise_conv_reference
from spe.models import ClassifierConfig, DecoderLM, EncoderClassifier, ModelConfig
from spe.ops.common.state import LinearAttentionState
from spe.lab.music.config import TrainConfig, load_config_file
from spe.lab.engine.optim import decayed_parameter_names, param_groups

TINY = {"vocab_size": 20, "d_model": 16, "num_heads": 2, "num_layers": 2, "d_ff": 32, "num_realizations": 8,
        "num_features": 8, "dropout": 0.0, "chunk_size": 4}


def _inputs(seed, *shape, requires_grad=True):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(requires_grad)


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("length", [1, 2, 9])  # shorter and longer than the cache
@pytest.mark.parametrize("causal,with_cache", [(True, False), (True, True), (False, False)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_fast_conv_equals_its_float64_reference_forward_and_backward(width, length, causal, with_cache,
                                                                         with_bias):
    x, weight, bias = _inputs(0, 2, length, 5), _inputs(1, 5, width), _inputs(2, 5) if with_bias else None
    cache = _inputs(3, 2, width - 1, 5) if with_cache else None
    y, new_cache = depthwise_conv(x, weight, bias, cache=cache, causal=causal)
    ref, ref_cache = depthwise_conv_reference(x, weight, bias, cache=cache, causal=causal)
    assert y.dtype == torch.float32 and ref.dtype == torch.float64
    torch.testing.assert_close(y.double(), ref, atol=1e-6, rtol=1e-6)
    if causal:
        torch.testing.assert_close(new_cache.double(), ref_cache, atol=0, rtol=0)  # copies of inputs
    else:
        assert new_cache is None and ref_cache is None
    upstream = _inputs(4, *y.shape, requires_grad=False)
    leaves = [t for t in (x, weight, bias, cache) if t is not None]
    fast = torch.autograd.grad((y * upstream).sum(), leaves)
    slow = torch.autograd.grad((ref * upstream.double()).sum(), leaves)
    for got, want in zip(fast, slow):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # both float32 leaves


def test_output_t_reads_inputs_up_to_t_only_and_the_centred_form_its_window():
    x, weight = _inputs(0, 1, 10, 3), _inputs(1, 3, 4)
    for causal, reach in ((True, range(-3, 1)), (False, range(-1, 3))):  # K = 4: lags the output reads
        y, _ = depthwise_conv(x, weight, causal=causal)
        grad = torch.autograd.grad(y[0, 5].sum(), x)[0][0].abs().sum(-1)  # (L,) dependence of y_5 on x_s
        read = {s - 5 for s in range(10) if grad[s] > 0}
        assert read == set(reach), (causal, read)


def test_a_sequence_in_pieces_with_the_carried_cache_equals_it_whole():
    x, weight = _inputs(0, 2, 11, 6, requires_grad=False), _inputs(1, 6, 4, requires_grad=False)
    whole, whole_cache = depthwise_conv(x, weight)
    cache, pieces = None, []
    for a, b in ((0, 1), (1, 3), (3, 4), (4, 11)):  # pieces shorter than K − 1 included
        y, cache = depthwise_conv(x[:, a:b], weight, cache=cache)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces, 1), whole, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(cache, whole_cache, atol=0, rtol=0)
    torch.testing.assert_close(cache, x[:, -3:], atol=0, rtol=0)


# One model per kind of kernel state the convolution's cache travels with.
KINDS = [
    {"positional": "sinespe", "attention": "performer"},
    {"positional": "ape", "attention": "softmax"},
    {"positional": "rope", "attention": "linear-elu"},
    {"positional": "sinespe", "attention": "performer", "attention_window": 5},
]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: "-".join(str(v) for v in k.values()))
def test_decoding_step_by_step_and_after_a_prefill_equals_the_parallel_forward(kind):
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(**TINY, short_conv=4, **kind)).eval()
    tokens = torch.randint(0, 20, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for block in model.blocks:  # projections large enough for attention to shape the logits
            block.attn.qkv.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(2))
        full = model(tokens)
        state, steps = None, []
        for t in range(13):
            logits, state = model.step(tokens[:, t], state)
            steps.append(logits)
        prefilled, state = model.prefill(tokens[:, :6])
        continued = [prefilled]
        for t in range(6, 13):
            logits, state = model.step(tokens[:, t], state)
            continued.append(logits[:, None])
    assert isinstance(state.layers[0], ShortConvState) and state.layers[0].cache.shape == (2, 3, 48)
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(continued, 1), full, atol=1e-5, rtol=1e-5)
    # control: the taps on the K − 1 previous inputs (what decoding carries) shape the logits
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv_conv.weight[:, :-1] = 0
        assert (model(tokens) - full).abs().max() > 1e-2


def test_a_layer_with_a_short_conv_refuses_a_bare_kernel_state_and_one_without_it_a_wrapped_one():
    x = torch.randn(1, 1, 8)
    with_conv, plain = (MultiHeadAttention(8, 2, attention="linear-elu", short_conv=k) for k in (3, 0))
    _, wrapped = with_conv.step(x, None, None)
    _, bare = plain.step(x, None, None)
    assert isinstance(wrapped, ShortConvState) and isinstance(bare, LinearAttentionState)
    with pytest.raises(TypeError, match="short convolution: .*ShortConvState, got LinearAttentionState"):
        with_conv.step(x, None, bare)
    with pytest.raises(TypeError, match="got ShortConvState"):
        plain.step(x, None, wrapped)


# Logits and state-dict keys of this seeded model, printed from the code before short_conv existed.
BEFORE_LOGITS = [[0.23861901462078094, 0.041327040642499924, -0.032619282603263855, -0.191275954246521],
                 [-0.03466912731528282, 0.12332234531641006, 0.052768342196941376, -0.04326128959655762],
                 [-0.0019190933089703321, 0.062176767736673355, -0.052408281713724136, 0.0718812569975853]]
BEFORE_KEYS = {f"blocks.{i}.{name}" for i in range(2) for name in (
    "attn.out.weight", "attn.projection", "attn.qkv.weight", "ffn.0.bias", "ffn.0.weight", "ffn.2.bias",
    "ffn.2.weight", "norm1.bias", "norm1.weight", "norm2.bias", "norm2.weight")} | {
    "embed.weight", "encoding.frequency_logits", "encoding.gains", "encoding.phases", "head.weight", "norm.bias",
    "norm.weight"}


@pytest.mark.slow
def test_short_conv_0_leaves_outputs_state_dict_and_header_as_before():
    torch.manual_seed(0)
    config = ModelConfig(**TINY, short_conv=0)
    model = DecoderLM(config).eval()
    with torch.no_grad():
        logits = model(torch.arange(12)[None])
    assert set(model.state_dict()) == BEFORE_KEYS and "short_conv" not in config.to_dict()
    torch.testing.assert_close(logits[0, ::4, :4], torch.tensor(BEFORE_LOGITS), atol=1e-6, rtol=0)
    torch.manual_seed(0)
    with_conv = DecoderLM(ModelConfig(**TINY, short_conv=4))
    assert set(with_conv.state_dict()) - BEFORE_KEYS == {"blocks.0.attn.qkv_conv.weight", "blocks.1.attn.qkv_conv.weight"}


def test_conv_weights_are_positional_parameters_never_weight_decayed():
    for model in (DecoderLM(ModelConfig(**TINY, short_conv=4)),
                  EncoderClassifier(ClassifierConfig(**TINY, num_classes=3, short_conv=4))):
        named = dict(model.named_parameters())
        convs = [n for n in named if "qkv_conv" in n]
        assert convs == ["blocks.0.attn.qkv_conv.weight", "blocks.1.attn.qkv_conv.weight"]
        assert not set(convs) & set(decayed_parameter_names(model))
        decay, _, scaled = param_groups(model, 0.1, positional_lr_scale=3.0)
        assert not any(p is named[n] for p in decay["params"] for n in convs)
        assert all(any(p is named[n] for p in scaled["params"]) for n in convs) and scaled["lr_scale"] == 3.0


@pytest.mark.slow
def test_encoders_take_a_centred_conv_that_padding_never_reaches():
    torch.manual_seed(0)
    config = ClassifierConfig(**{**TINY, "vocab_size": 12}, num_classes=3, positional="rope",
                              attention="linear-elu", pooling="mean", short_conv=4)
    model = EncoderClassifier(config).eval()
    assert not model.blocks[0].attn.qkv_conv.causal
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(2, 12, (2, 7), generator=g)
    lengths = torch.tensor([7, 4])
    padded = torch.cat([tokens, torch.randint(2, 12, (2, 5), generator=g)], dim=1)  # real symbols as padding
    with torch.no_grad():
        short, long = model.encode(tokens, lengths), model.encode(padded, lengths)
        unmasked = model.encode(padded)
    torch.testing.assert_close(long, short, atol=2e-5, rtol=1e-5)
    assert (unmasked - short).abs().max() > 1e-2  # control: read as real, the extra tokens do change it


@pytest.mark.parametrize("value", [1, -1, True, 2.5, "4"])
def test_bad_widths_are_refused_naming_the_value(value):
    match = f"short_conv must be 0 \\(none\\) or an integer ≥ 2 .*got {value!r}"
    for build in (lambda: ModelConfig(**TINY, short_conv=value),
                  lambda: ClassifierConfig(**TINY, num_classes=2, short_conv=value),
                  lambda: MultiHeadAttention(8, 2, short_conv=value)):
        with pytest.raises(ValueError, match=match):
            build()
    assert check_short_conv(0) == 0 and check_short_conv(4) == 4


@pytest.mark.slow
def test_configs_and_checkpoints_carry_the_width_and_older_ones_load_with_0(tmp_path):
    config = ModelConfig(**TINY, short_conv=4)
    assert config.to_dict()["short_conv"] == 4 and ModelConfig.from_dict(config.to_dict()) == config
    old = ModelConfig(**TINY).to_dict()
    assert "short_conv" not in old and ModelConfig.from_dict(old).short_conv == 0
    assert ClassifierConfig.from_dict(ClassifierConfig(**TINY, num_classes=2, short_conv=3).to_dict()).short_conv == 3
    model = DecoderLM(config).eval()
    loaded = checkpoint.load(checkpoint.save(model, tmp_path / "run")).model
    assert loaded.config.short_conv == 4
    torch.testing.assert_close(loaded.blocks[1].attn.qkv_conv.weight, model.blocks[1].attn.qkv_conv.weight)


def test_a_toml_model_table_sets_the_width(tmp_path):
    path = tmp_path / "train.toml"
    path.write_text("steps = 2\n[model]\nshort_conv = 4\nd_model = 16\nnum_heads = 2\n")
    cfg = TrainConfig.from_dict(load_config_file(path))
    assert cfg.model_config(vocab_size=30).short_conv == 4
    with pytest.raises(ValueError, match="model option short_conv must be an integer, got 4.0"):
        TrainConfig(model={"short_conv": 4.0})


def test_cli_short_conv_flag_reaches_the_config():
    from spe.lab.cli.main import _train_config, build_parser

    args = build_parser().parse_args(["train", "--short-conv", "4", "--decay", "gated"])
    assert _train_config(args).model["short_conv"] == 4
    with pytest.raises(ValueError, match="short_conv"):
        _train_config(build_parser().parse_args(["train", "--short-conv", "-1"]))

"""FoX-Pro's block (``output_gate``, ``qk_norm``, ``kv_shift``, ``output_norm``): the layer equals
a float64 reference written from the formulas, forward and backward (inputs small enough that
the norms' ε matter); the shift looks back one token only; decoding step by step and after a
prefill equals the parallel forward for FoX-Pro, a linear kernel and sineSPE; the options are
off by default (no parameter, no header key), refused unless bools, carried by configs and
checkpoints; padding never reaches a real position through the shift; state passing carries
the shift's state."""

import math

import pytest
import torch

from spe import checkpoint
from spe.attention.layer import MultiHeadAttention
from spe.attention.pro import PRO_OPTIONS, QK_NORM_EPS, HeadRMSNorm, ShiftState, token_shift
from spe.encodings.short_conv import ShortConvState
from spe.models import ClassifierConfig, DecoderLM, EncoderClassifier, ModelConfig

C, H, L = 12, 3, 7
D = C // H
ALL = dict.fromkeys(PRO_OPTIONS, True)
TINY = {"vocab_size": 20, "d_model": 16, "num_heads": 2, "num_layers": 2, "d_ff": 32, "num_realizations": 8,
        "num_features": 8, "dropout": 0.0, "chunk_size": 4}


def _randn(seed, *shape, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _sigmoid(z):  # written out, not torch.sigmoid: the reference must not share the code it checks
    return 1.0 / (1.0 + torch.exp(-z))


def _rms(x, eps):
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps)


def _reference(layer, x, options):
    """The FoX layer (softmax, decay 'gated') with ``options`` in float64, written from the formulas
    of spe.attention.pro; the parameters are the layer's, cast (so gradients reach them)."""
    b, n, _ = x.shape
    x = x.double()
    q, k, v = (x @ layer.qkv.weight.double().T).view(b, n, 3, H, D).unbind(2)
    if options.get("kv_shift"):
        logits = x @ layer.pro.shift.weight.double().T  # (B, L, 2H): keys' α, then values' β
        for t_weights, which in ((logits[..., :H], "k"), (logits[..., H:], "v")):
            a = _sigmoid(t_weights)
            z = k if which == "k" else v
            rows = [(1 - a[:, 0, :, None]) * z[:, 0]]  # z_{−1} = 0
            rows += [a[:, t, :, None] * z[:, t - 1] + (1 - a[:, t, :, None]) * z[:, t] for t in range(1, n)]
            if which == "k":
                k = torch.stack(rows, 1)
            else:
                v = torch.stack(rows, 1)
    if options.get("qk_norm"):
        q = _rms(q, 1e-5) * layer.pro.q_norm.weight.double()
        k = _rms(k, 1e-5) * layer.pro.k_norm.weight.double()
    gates = layer.decay_gate(x.float()).double()  # (B, L, H), tested in tests/ops/test_gates.py
    f = gates.cumsum(1)
    scores = torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(D) + (f[:, :, None] - f[:, None]).permute(0, 3, 1, 2)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    y = torch.einsum("bhmn,bnhd->bmhd", scores.softmax(-1), v)
    if options.get("output_norm"):
        y = _rms(y, 1e-5) * layer.output_norm.weight.double()
    if options.get("output_gate"):
        y = y * _sigmoid(x @ layer.pro.gate.weight.double().T).view(b, n, H, D)
    return y.flatten(2) @ layer.out.weight.double().T


def _fox_layer(seed=0, **options):
    torch.manual_seed(seed)
    layer = MultiHeadAttention(C, H, attention="softmax", decay="gated", positional=None, **options)
    with torch.no_grad():  # scales and a gate away from their starting values, so each term shows
        layer.decay_gate.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
        for name, p in layer.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(2))
    return layer


@pytest.mark.parametrize("scale", [1.0, 1e-3])  # 1e-3: q, k and y² ~ 1e-6, below ε = 1e-5
@pytest.mark.parametrize("options", [{"output_gate": True}, {"qk_norm": True}, {"kv_shift": True},
                                     {"output_norm": True}, ALL], ids=lambda o: "+".join(o) if len(o) < 4 else "all")
def test_the_layer_equals_its_float64_reference_forward_and_backward(options, scale):
    layer = _fox_layer(**options)
    with torch.no_grad():
        layer.qkv.weight.mul_(scale)
    x = _randn(3, 2, L, C).requires_grad_(True)
    y, ref = layer(x), _reference(layer, x, options)
    # float32 against float64: a few roundings of u = 6e-8 relative to the output through C-term sums
    torch.testing.assert_close(y.double(), ref, atol=2e-6 * float(ref.detach().abs().max()), rtol=1e-5)
    leaves = [x, *layer.parameters()]
    upstream = _randn(4, *y.shape)
    fast = torch.autograd.grad((y * upstream).sum(), leaves)
    slow = torch.autograd.grad((ref * upstream.double()).sum(), leaves)
    for got, want in zip(fast, slow):
        torch.testing.assert_close(got, want, atol=1e-5 * float(want.abs().max()) + 1e-7, rtol=1e-4)


def test_the_reference_tells_the_options_apart():
    """Control: each option changes the output (so the test above checks each one)."""
    x = _randn(3, 2, L, C)
    plain = _fox_layer()
    with torch.no_grad():
        base = plain(x)
        for name in PRO_OPTIONS:
            layer = _fox_layer(**{name: True})
            layer.load_state_dict(plain.state_dict(), strict=False)
            assert (layer(x) - base).abs().max() > 1e-3, name


def test_qk_norm_at_small_scales_is_set_by_its_epsilon():
    norm = HeadRMSNorm(H, D)
    x = _randn(0, 2, L, H, D, scale=1e-3)
    got = norm(x).double()
    torch.testing.assert_close(got, _rms(x.double(), 1e-5), atol=1e-9, rtol=1e-5)
    assert QK_NORM_EPS == 1e-5 and (got - _rms(x.double(), 1e-6)).abs().max() > 0.1


def test_the_token_shift_with_a_carried_position_and_padding_equals_its_definition():
    x, alpha, previous = _randn(0, 2, 6, H, D), torch.rand(2, 6, H, generator=torch.Generator().manual_seed(1)), \
        _randn(2, 2, H, D)
    mask = torch.tensor([[False] * 6, [False, False, True, False, True, True]])
    shifted, last = token_shift(x, alpha, previous, key_padding_mask=mask)
    for b in range(2):
        for t in range(6):
            before = previous[b] if t == 0 else (torch.zeros(H, D) if mask[b, t - 1] else x[b, t - 1])
            want = alpha[b, t, :, None] * before + (1 - alpha[b, t, :, None]) * x[b, t]
            torch.testing.assert_close(shifted[b, t], want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(last, x[:, -1], atol=0, rtol=0)  # unshifted: what the next position mixes in


def test_the_shift_looks_back_one_token_only_and_the_layer_is_causal():
    layer = _fox_layer(**ALL)
    x = _randn(3, 1, 9, C).requires_grad_(True)
    q, k, v = layer.project(x, None)
    for name, z, reach in (("q", q, {0}), ("k", k, {-1, 0}), ("v", v, {-1, 0})):
        grad = torch.autograd.grad(z[0, 5].sum(), x, retain_graph=True)[0][0].abs().sum(-1)  # (L,)
        assert {s - 5 for s in range(9) if grad[s] > 0} == reach, name
    y = layer(x)
    grad = torch.autograd.grad(y[0, 4].sum(), x)[0][0].abs().sum(-1)
    assert grad[5:].max() == 0 and grad[:5].min() > 0


# FoX-Pro, a linear kernel (normaliser-free, with a short convolution: two wrapped states) and sineSPE.
KINDS = [
    {"positional": "none", "attention": "softmax", "decay": "gated"},
    {"positional": "rope", "attention": "linear", "short_conv": 4},
    {"positional": "sinespe", "attention": "performer", "decay": "gated"},
]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: "-".join(str(v) for v in k.values()))
def test_decoding_step_by_step_and_after_a_prefill_equals_the_parallel_forward(kind):
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(**TINY, **ALL, **kind)).eval()
    tokens = torch.randint(0, 20, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for block in model.blocks:  # projections large enough for attention to shape the logits
            block.attn.qkv.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(2))
        full = model(tokens)
        state, steps = None, []
        for t in range(11):
            logits, state = model.step(tokens[:, t], state)
            steps.append(logits)
        prefilled, state = model.prefill(tokens[:, :5])
        continued = [prefilled]
        for t in range(5, 11):
            logits, state = model.step(tokens[:, t], state)
            continued.append(logits[:, None])
        shift = state.layers[0].inner if "short_conv" in kind else state.layers[0]
        assert isinstance(shift, ShiftState) and shift.keys.shape == (2, 2, 8)
        torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.cat(continued, 1), full, atol=1e-5, rtol=1e-5)
        # control: the carried keys and values shape the next position's logits
        _, state = model.prefill(tokens[:, :5])
        layers = [_forget_previous(s) for s in state.layers]
        forgot, _ = model.step(tokens[:, 5], type(state)(layers=layers, position=state.position))
        assert (forgot - full[:, 5]).abs().max() > 1e-3


def _forget_previous(state):
    if isinstance(state, ShortConvState):
        return ShortConvState(inner=_forget_previous(state.inner), cache=state.cache)
    return ShiftState(inner=state.inner, keys=torch.zeros_like(state.keys), values=torch.zeros_like(state.values))


def test_a_layer_with_a_shift_refuses_a_bare_kernel_state_and_one_without_it_a_shift_state():
    x = torch.randn(1, 1, 8)
    shifted, plain = (MultiHeadAttention(8, 2, attention="linear-elu", kv_shift=s) for s in (True, False))
    _, wrapped = shifted.step(x, None, None)
    _, bare = plain.step(x, None, None)
    assert isinstance(wrapped, ShiftState) and not isinstance(bare, ShiftState)
    with pytest.raises(TypeError, match="kv_shift.*decodes with a ShiftState, got LinearAttentionState"):
        shifted.step(x, None, bare)
    with pytest.raises(TypeError, match="got ShiftState"):
        plain.step(x, None, wrapped)


def test_the_options_are_off_by_default_with_no_parameter_and_no_header_key():
    config = ModelConfig(**TINY)
    assert not any(getattr(config, name) for name in PRO_OPTIONS)
    assert not set(PRO_OPTIONS) & set(config.to_dict())
    model = DecoderLM(config)
    assert all(block.attn.pro is None and block.attn.output_norm is None for block in model.blocks)
    keys = set(DecoderLM(ModelConfig(**TINY, **ALL)).state_dict()) - set(model.state_dict())
    assert keys == {f"blocks.{i}.attn.{name}" for i in range(2) for name in (
        "pro.shift.weight", "pro.q_norm.weight", "pro.k_norm.weight", "pro.gate.weight", "output_norm.weight")}
    linear = DecoderLM(ModelConfig(**TINY, attention="linear", output_norm=True))  # has its norm already
    assert set(linear.state_dict()) == set(DecoderLM(ModelConfig(**TINY, attention="linear")).state_dict())


@pytest.mark.parametrize("value", [1, "true", None])
def test_options_that_are_not_bools_are_refused_naming_the_value(value):
    for name in PRO_OPTIONS:
        match = f"{name} must be true or false .*got {value!r}"
        for build in (lambda: ModelConfig(**TINY, **{name: value}),
                      lambda: ClassifierConfig(**TINY, num_classes=2, **{name: value}),
                      lambda: MultiHeadAttention(8, 2, **{name: value})):
            with pytest.raises(ValueError, match=match):
                build()


def test_configs_and_checkpoints_carry_the_options_and_older_ones_load_without(tmp_path):
    config = ModelConfig(**TINY, **ALL, attention="softmax", decay="gated", positional="none")
    assert ModelConfig.from_dict(config.to_dict()) == config and config.to_dict()["kv_shift"] is True
    assert not ModelConfig.from_dict(ModelConfig(**TINY).to_dict()).qk_norm
    assert ClassifierConfig.from_dict(ClassifierConfig(**TINY, num_classes=2, output_gate=True).to_dict()).output_gate
    torch.manual_seed(0)
    model = DecoderLM(config).eval()
    loaded = checkpoint.load(checkpoint.save(model, tmp_path / "run")).model.eval()
    assert all(getattr(loaded.config, name) for name in PRO_OPTIONS)
    tokens = torch.randint(0, 20, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model(tokens), atol=0, rtol=0)


def test_model_options_reach_the_config_and_wrong_types_are_refused():
    from spe.lab.cli.main import _train_config, build_parser

    args = build_parser().parse_args(["train", "--attention", "softmax", "--decay", "gated", "--positional", "none",
                                      *(f for name in PRO_OPTIONS for f in ("--model-option", f"{name}=true"))])
    cfg = _train_config(args)
    assert all(cfg.model[name] is True for name in PRO_OPTIONS)
    assert all(getattr(cfg.model_config(vocab_size=30), name) for name in PRO_OPTIONS)
    with pytest.raises(ValueError, match="qk_norm"):
        _train_config(build_parser().parse_args(["train", "--model-option", "qk_norm=1"]))


def test_padding_never_reaches_a_real_position_through_the_shift():
    torch.manual_seed(0)
    config = ClassifierConfig(**{**TINY, "vocab_size": 12}, num_classes=3, positional="rope",
                              attention="linear-elu", pooling="mean", **ALL)
    model = EncoderClassifier(config).eval()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(2, 12, (2, 7), generator=g)
    lengths = torch.tensor([7, 4])
    padded = torch.cat([tokens, torch.randint(2, 12, (2, 5), generator=g)], dim=1)  # real symbols as padding
    with torch.no_grad():
        short, long, unmasked = model.encode(tokens, lengths), model.encode(padded, lengths), model.encode(padded)
    torch.testing.assert_close(long, short, atol=2e-5, rtol=1e-5)
    assert (unmasked - short).abs().max() > 1e-2  # control: read as real, the extra tokens do change it


def test_attention_weights_see_the_shifted_normalised_keys():
    layer = _fox_layer(**ALL)
    x = _randn(3, 2, L, C)
    with torch.no_grad():
        weights = layer.attention_weights(x)
        _, _, v = layer.project(x, None)
        y = layer._output(torch.einsum("bhmn,bnhd->bmhd", weights, v), x)
        torch.testing.assert_close(y, layer(x), atol=1e-6, rtol=1e-5)


def test_state_passing_carries_the_shift_state():
    from spe.lab.music.state_passing import state_from_dict, state_to_dict

    model = DecoderLM(ModelConfig(**TINY, attention="linear-elu", positional="rope", kv_shift=True, short_conv=3))
    _, state = model.prefill(torch.randint(0, 20, (2, 6)))
    back = state_from_dict(state_to_dict(state))
    inner, again = state.layers[1].inner, back.layers[1].inner
    assert isinstance(again, ShiftState)
    torch.testing.assert_close(again.keys, inner.keys, atol=0, rtol=0)
    torch.testing.assert_close(again.inner.kv, inner.inner.kv, atol=0, rtol=0)
    wide = state.layers[1].to(torch.float64)  # the conv's cache, the shift's keys, the kernel's sums
    assert (wide.cache.dtype, wide.inner.values.dtype, wide.inner.inner.kv.dtype) == (torch.float64,) * 3
    assert (wide.position, wide.window) == (6, None)


@pytest.mark.slow
def test_fox_pro_trains_from_the_command_line(midi_folder, tmp_path):
    from spe.checkpoint import load_metadata
    from spe.lab.cli.main import main

    run = tmp_path / "foxpro"
    argv = ["train", "--data", str(midi_folder), "--cache-dir", str(tmp_path / "cache"), "--out", str(run),
            "--seq-len", "32", "--batch-size", "2", "--d-model", "32", "--num-layers", "1", "--num-heads", "2",
            "--eval-every", "2", "--threads", "1", "--steps", "2", "--no-progress", "--attention", "softmax",
            "--decay", "gated", "--positional", "none",
            *(f for name in PRO_OPTIONS for f in ("--model-option", f"{name}=true"))]
    with pytest.warns(UserWarning, match="broken.mid"):
        assert main(argv) == 0
    meta = load_metadata(run)
    assert meta["step"] == 2 and all(meta["config"][name] is True for name in PRO_OPTIONS)
    model = checkpoint.load(run).model
    assert model.blocks[0].attn.pro.shift is not None


FOX_PRO_ROW = """
[variants.fox-pro]
description = "FoX-Pro: FoX + output gate, QK-norm, token shift of k and v, output norm"
model = { positional = "none", attention = "softmax", decay = "gated", output_gate = true, qk_norm = true, kv_shift = true, output_norm = true }
"""


def test_a_sweep_plan_row_builds_fox_pro(tmp_path):
    from spe.lab.music.plan import variant_config
    from spe.lab.plans import load_plan

    path = tmp_path / "fox-pro.toml"
    path.write_text("seeds = [0]\n" + FOX_PRO_ROW)
    model = variant_config(load_plan(str(path), "music"), "fox-pro", 0, tmp_path / "out").model_config(vocab_size=30)
    assert (model.attention, model.decay, model.positional) == ("softmax", "gated", "none")
    assert all(getattr(model, name) for name in PRO_OPTIONS)
    path.write_text("seeds = [0]\n" + FOX_PRO_ROW.replace("kv_shift = true", "kv_shift = 1"))
    with pytest.raises(ValueError, match="fox-pro.*kv_shift"):
        load_plan(str(path), "music")

"""LRPE, PermuteFormer and cosFormer in the attention layer: each against its slow O(L²) float64
twin (forward and backward), recurrent == parallel, causality, the relative property, encoder
padding, and the registry's refusals.

Tolerances: fast path and twin both run in float64 and differ only by summation order, so
their gap is a few hundred ulps of O(1) quantities (≲ 1e-13); 1e-9 leaves room and still
catches any wrong term (a wrong angle, power or cosine changes outputs by ≳ 1e-3)."""

import pytest
import torch

from spe.attention import MultiHeadAttention
from spe.encodings import LRPE, CosFormerReweighting, PermuteFeatures
from spe.models import ClassifierConfig, DecoderLM, EncoderClassifier, ModelConfig
from spe.ops import causal_linear_attention_with_state

TOL = dict(atol=1e-9, rtol=0)
H, D, MF = 2, 6, 8  # heads, head_dim, FAVOR+ features

# (positional, kernel) pairs: LRPE needs strictly positive features, the others take ReLU too
PAIRS = [("lrpe", "performer"), ("lrpe", "linear-elu"), ("lrpe-learned", "performer"),
         ("permute", "performer"), ("permute", "linear-relu"), ("permute", "linear-elu"),
         ("cosformer", "performer"), ("cosformer", "linear-relu"), ("cosformer", "linear-elu")]


def _transform(name: str, kernel: str, max_length: int = 64):
    m = MF if kernel == "performer" else D
    if name == "lrpe":
        return LRPE(H, m)
    if name == "lrpe-learned":
        t = LRPE(H, m, angles="learned")
        with torch.no_grad():  # move away from the fixed values, per head, so the test sees H × M angles
            t.angles.mul_(torch.linspace(0.5, 1.5, H * m).view(H, m))
        return t
    if name == "permute":
        return PermuteFeatures(H, m, generator=torch.Generator().manual_seed(3))
    return CosFormerReweighting(max_length)


def _layer(name: str, kernel: str, *, causal: bool = True, seed: int = 0, chunk: int = 4) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(H * D, H, attention=kernel, causal=causal, num_features=MF, chunk_size=chunk,
                              positional=_transform(name, kernel)).double()


def _x(n: int, seed: int = 1, b: int = 2) -> torch.Tensor:
    return torch.randn(b, n, H * D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _reference(layer: MultiHeadAttention, x: torch.Tensor, positions: torch.Tensor, *, causal: bool,
               mask: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_n w(m, n) v_n / Σ_n w'(m, n) with the transform's explicit weights, through the layer's
    projections and feature map only (FAVOR+ keys at their true scale)."""
    q, k, v = layer.project(x, None)
    projection = layer.projection if layer.kernel.random_features else None
    fq, fk, log_scale = layer.kernel.features(q, k, projection)
    if log_scale is not None:
        fk = fk * torch.exp(log_scale)[..., None]
    num, den = layer.feature_transform.weights_reference(fq, fk, positions)  # (B, H, L, L)
    keep = torch.ones(num.shape[-2:], dtype=torch.bool)
    keep = keep.tril() if causal else keep
    keep = keep[None, None] if mask is None else keep[None, None] & ~mask[:, None, None, :]
    num, den = num * keep, den * keep
    total = den.sum(-1).transpose(1, 2)[..., None]  # (B, L, H, 1)
    # no key with any weight (ReLU features): output 0, the kernels' convention (spe.ops.normalise)
    y = torch.einsum("bhmn,bnhe->bmhe", num, v) / torch.where(total == 0, 1.0, total)
    return layer.out(y.reshape(x.shape))


def _grads(layer, out):
    params = [p for p in layer.parameters() if p.requires_grad]
    return torch.autograd.grad(out.square().sum(), params)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name,kernel", PAIRS)
def test_layer_equals_its_slow_twin_forward_and_backward(name, kernel, causal):
    layer = _layer(name, kernel, causal=causal)
    x = _x(11)
    pos = torch.arange(11) + 3
    fast, slow = layer(x, positions=pos), _reference(layer, x, pos, causal=causal)
    torch.testing.assert_close(fast, slow, **TOL)
    grads = dict(zip([n for n, p in layer.named_parameters() if p.requires_grad], _grads(layer, fast)))
    for a, b in zip(grads.values(), _grads(layer, slow)):
        torch.testing.assert_close(a, b, **TOL)
    if name == "lrpe-learned":  # the angles are trained: they get a gradient (checked above against the twin)
        assert grads["feature_transform.angles"].abs().max() > 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("name,kernel", PAIRS)
def test_the_transform_changes_the_outputs(name, kernel):
    # guards the twin test against a transform that does nothing
    layer = _layer(name, kernel)
    plain = MultiHeadAttention(H * D, H, attention=kernel, num_features=MF, chunk_size=4).double()
    plain.load_state_dict(layer.state_dict(), strict=False)
    x = _x(9)
    assert (layer(x) - plain(x)).abs().max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("name,kernel", PAIRS)
def test_recurrent_steps_equal_the_parallel_pass_outputs_state_and_gradients(name, kernel):
    layer = _layer(name, kernel, chunk=3)
    x = _x(10).requires_grad_()
    parallel = layer(x)
    state, steps = None, []
    for i in range(10):
        y, state = layer.step(x[:, i:i + 1], None, state)
        steps.append(y)
    steps = torch.cat(steps, dim=1)
    torch.testing.assert_close(steps, parallel, **TOL)
    q, k, v = layer.project(x, None)
    f = layer.features(q, k, torch.arange(10))
    _, final = causal_linear_attention_with_state(f.q, f.k, v, chunk_size=3, normalizer=f.normalizer,
                                                  key_log_scale=f.key_log_scale)
    assert state.position == final.position == 10
    torch.testing.assert_close(state.kv, final.kv, **TOL)
    torch.testing.assert_close(state.normalizer, final.normalizer, **TOL)
    for a, b in zip(torch.autograd.grad(steps.square().sum(), [x, *layer.parameters()]),
                    torch.autograd.grad(parallel.square().sum(), [x, *layer.parameters()])):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.slow
@pytest.mark.parametrize("name,kernel", PAIRS)
def test_causal_outputs_ignore_the_future(name, kernel):
    layer = _layer(name, kernel)
    x = _x(12)
    changed = x.clone()
    changed[:, 7:] += 3.0
    with torch.no_grad():
        a, b = layer(x), layer(changed)
    torch.testing.assert_close(b[:, :7], a[:, :7], **TOL)
    assert (b[:, 7:] - a[:, 7:]).abs().max() > 1e-3


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name,kernel", PAIRS)
def test_weights_depend_on_the_lag_only(name, kernel, causal):
    # identical content at every position: the weight of query m on key n is a function of m − n
    # (a Toeplitz matrix), and shifting all positions changes no output
    layer = _layer(name, kernel, causal=causal)
    x = _x(1, b=1).expand(1, 10, -1)
    with torch.no_grad():
        q, k, _ = layer.project(x, None)
        f = layer.features(q, k, torch.arange(10))
        weights = torch.einsum("bmhd,bnhd->bhmn", f.q, f.k)
        if f.key_log_scale is not None:
            weights = weights * torch.exp(f.key_log_scale).permute(0, 2, 1)[:, :, None, :]
        torch.testing.assert_close(weights[..., 1:, 1:], weights[..., :-1, :-1], **TOL)
        assert (weights[..., 0, :] - weights[..., 0, 0:1]).abs().max() > 1e-3  # not constant in the lag
        y = _x(10, seed=2, b=1)
        base = layer(y, positions=torch.arange(10))
        shift = 40 if name == "cosformer" else 100_003
        torch.testing.assert_close(layer(y, positions=torch.arange(10) + shift), base, **TOL)


@pytest.mark.slow
@pytest.mark.parametrize("name,kernel", PAIRS)
def test_encoder_outputs_at_real_positions_ignore_padding(name, kernel):
    layer = _layer(name, kernel, causal=False)
    x = _x(13, b=1)
    padded = torch.cat([x, 5 * _x(7, seed=9, b=1)], dim=1)
    mask = torch.zeros(1, 20, dtype=torch.bool)
    mask[:, 13:] = True
    with torch.no_grad():
        alone = layer(x)
        with_padding = layer(padded, key_padding_mask=mask)
        other_padding = layer(torch.cat([x, -_x(7, seed=4, b=1)], dim=1), key_padding_mask=mask)
        slow = _reference(layer, padded, torch.arange(20), causal=False, mask=mask)
    torch.testing.assert_close(with_padding[:, :13], alone, **TOL)
    torch.testing.assert_close(other_padding[:, :13], alone, **TOL)
    torch.testing.assert_close(with_padding[:, :13], slow[:, :13], **TOL)


@pytest.mark.parametrize("positional", ["lrpe", "permute", "cosformer"])
def test_softmax_refuses_feature_transforms_at_build_time(positional):
    with pytest.raises(ValueError, match=rf"positional '{positional}' .*softmax.*'performer' or 'linear-relu' or 'linear-elu'"):
        ModelConfig(vocab_size=10, positional=positional, attention="softmax")
    with pytest.raises(ValueError, match="softmax attention does not have"):
        MultiHeadAttention(12, 2, attention="softmax", positional=CosFormerReweighting(8))


def test_lrpe_refuses_relu_features_like_rope():
    with pytest.raises(ValueError, match="positional 'lrpe' .*linear.*strictly positive"):
        ModelConfig(vocab_size=10, positional="lrpe", attention="linear-relu")
    with pytest.raises(ValueError, match="LRPE .*strictly positive"):
        MultiHeadAttention(12, 2, attention="linear-relu", positional=LRPE(2, 6))


def test_a_feature_transform_gets_the_kernels_feature_size():
    with pytest.raises(ValueError, match=r"PermuteFormer .*6 features.*16 \(num_features\)"):
        MultiHeadAttention(12, 2, attention="performer", num_features=16, positional=PermuteFeatures(2, 6))


@pytest.mark.parametrize("positional,attention", [("lrpe", "performer"), ("permute", "linear-relu"),
                                                  ("cosformer", "linear-elu")])
def test_models_decode_step_by_step_as_their_forward_and_encode_with_padding(positional, attention):
    config = ModelConfig(vocab_size=30, d_model=16, num_heads=2, num_layers=2, d_ff=32, num_features=8,
                         positional=positional, attention=attention, dropout=0.0, lrpe_angles="learned")
    model = DecoderLM(config).eval()
    tokens = torch.randint(0, 30, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(tokens)
        state, steps = None, []
        for i in range(9):
            y, state = model.step(tokens[:, i], state)
            steps.append(y.reshape(2, 1, -1))
    # float32 end to end: both forms round differently, at ~1e-7 of O(1) logits
    torch.testing.assert_close(torch.cat(steps, 1), logits, atol=1e-5, rtol=1e-5)
    encoder = EncoderClassifier(ClassifierConfig(vocab_size=30, d_model=16, num_heads=2, num_layers=1, d_ff=32,
                                                 num_features=8, positional=positional, attention=attention,
                                                 num_classes=3, dropout=0.0)).eval()
    with torch.no_grad():
        short = encoder(tokens[:1, :5], torch.tensor([5]))
        padded = encoder(tokens[:1], torch.tensor([5]))
    torch.testing.assert_close(padded, short, atol=1e-5, rtol=1e-5)


def test_registry_entries_say_where_they_act():
    from spe.encodings import positional_names, positional_spec

    assert positional_names(acts_on="features") == ("lrpe", "permute", "cosformer")
    assert positional_spec("lrpe").positive_features and not positional_spec("permute").positive_features
    from spe.attention.layer import positional_role
    from spe.models import ModelConfig

    for name in ("lrpe", "permute", "cosformer"):
        config = ModelConfig(vocab_size=8, d_model=16, num_heads=2, positional=name, attention="linear-elu")
        assert positional_role(positional_spec(name).build_layer_module(config)) == "feature_transform"

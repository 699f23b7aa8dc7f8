"""MultiHeadAttention(attention_blocks=N): the Music Transformer's block-local attention with every kind
of positional encoding softmax takes (none, score terms, queries-keys codes and rotations), equal to
the L x L masked form in float64 forward and backward, decoding equal to forward, and its refusals."""

import pytest
import torch
from conftest import LargestTensor

from spe.attention import MultiHeadAttention
from spe.encodings import ALiBi, MusicRelativePosition, RotaryEncoding, ShawRelativePosition, SineSPE, SPEFilter
from spe.encodings.path import PathEncoding
from spe.models import DecoderLM, ModelConfig
from spe.ops.softmax.naive import block_local_reference

C, H, N, R = 16, 2, 4, 6
D = C // H


def _module(positional, causal):
    return {"none": lambda: None,
            "music-relative": lambda: MusicRelativePosition(H, D, 5, causal=causal),
            "alibi": lambda: ALiBi(H, causal=causal),
            "shaw": lambda: ShawRelativePosition(D, 5, causal=causal),
            "rope": lambda: RotaryEncoding(),
            "sinespe": lambda: SPEFilter(H, D)}[positional]()


def _layer(positional="none", *, causal=True, blocks=N):
    torch.manual_seed(0)
    layer = MultiHeadAttention(C, H, attention="softmax", causal=causal, positional=_module(positional, causal),
                               num_realizations=R if positional == "sinespe" else None,
                               attention_blocks=blocks).double().eval()
    with torch.no_grad():  # relative embeddings away from their small initial values, so the terms matter
        for name, p in layer.named_parameters():
            if "embeddings" in name or "rel_" in name:
                p.normal_()
    return layer


def _code(layer, n, positions=None):
    """A fixed SPE code of positions 0 … n − 1 (or of ``positions``: the same draw)."""
    if layer.spe_filter is None:
        return None
    torch.manual_seed(5)
    spe = SineSPE(H, D, R, num_sines=2)
    code = spe(n if positions is None else None, positions=positions, generator=torch.Generator().manual_seed(4))
    return type(code)(**{k: v.double() for k, v in vars(code).items()})


def _x(n, seed=1):
    return torch.randn(2, n, C, generator=torch.Generator().manual_seed(seed), dtype=torch.float64,
                       requires_grad=True)


def _reference(layer, x, code, causal):
    """The layer's output from the L x L masked form: its q, k (rotated by RoPE), v and score term."""
    q, k, v = layer.project(x, code)
    n = x.shape[1]
    if layer.rotary is not None:
        f = layer.features(q, k, torch.arange(n))
        q, k = f.q, f.k
    bias = None if layer.score_encoding is None else layer.score_encoding.score_bias(q, n)
    return layer._output(block_local_reference(q, k, v, N, causal=causal, bias=bias))


@pytest.mark.parametrize("positional", ["none", "music-relative", "alibi", "rope", "sinespe"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [3, 9, 14])
def test_equals_the_masked_float64_form_forward_and_backward(positional, causal, n):
    layer = _layer(positional, causal=causal)
    x = _x(n)
    code = _code(layer, n)
    y = layer(x, code)
    ref = _reference(layer, x, code, causal)
    torch.testing.assert_close(y, ref)
    g = torch.randn_like(y)
    params = [p for p in layer.parameters() if p.requires_grad]
    got = torch.autograd.grad(y, [x, *params], g, allow_unused=True)
    want = torch.autograd.grad(ref, [x, *params], g, allow_unused=True)
    for a, b in zip(got, want):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("positional", ["none", "music-relative", "alibi", "shaw", "rope"])
def test_up_to_two_blocks_it_is_the_whole_past(positional):
    """With L ≤ 2N every query's window holds its whole past: Shaw's value term included, the
    score terms must see the true distances (keys offset by the window's start)."""
    layer = _layer(positional)
    x = _x(2 * N - 1)
    full = _layer(positional, blocks=None)
    torch.testing.assert_close(layer(x), full(x))


@pytest.mark.parametrize("positional", ["none", "music-relative", "shaw", "alibi"])
@pytest.mark.parametrize("causal", [True, False])
def test_a_token_two_blocks_back_changes_nothing_one_block_back_does(positional, causal):
    layer = _layer(positional, causal=causal)
    x = _x(16)
    y = layer(x)
    x2 = x.detach().clone()
    x2[:, 5] += 1.0  # block 1
    changed = (layer(x2) - y).abs().amax(dim=(0, 2)) > 1e-12
    assert not changed[12:].any() and changed[8:12].all() and not changed[:4].any()


@pytest.mark.parametrize("positional", ["none", "music-relative", "shaw", "alibi", "rope", "sinespe"])
@pytest.mark.parametrize("prompt", [0, 6])
def test_decoding_equals_forward(positional, prompt):
    layer = _layer(positional)
    n = 13
    x = _x(n).detach()
    code = _code(layer, n)
    y = layer(x, code)
    outs, state = [], None
    if prompt:
        out, state = layer.prefill(x[:, :prompt], _code(layer, prompt))
        outs.append(out)
    for t in range(prompt, n):
        out, state = layer.step(x[:, t:t + 1], _code(layer, 1, torch.tensor([t])), state)
        assert state.keys.shape[1] <= 2 * N
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=1), y)


def test_attention_weights_are_the_block_mask_and_give_forward():
    layer = _layer("music-relative")
    x = _x(11).detach()
    w = layer.attention_weights(x, dtype=torch.float64)
    assert (w[..., 8:, :4] == 0).all() and (w[..., 8:, 4:8] > 0).all() and (w[..., 4:8, 0:4] > 0).all()
    _, _, v = layer.project(x, None)
    torch.testing.assert_close(layer._output(torch.einsum("bhmn,bnhd->bmhd", w, v)), layer(x))


def test_encoder_padding_never_reaches_a_real_position():
    layer = _layer("music-relative", causal=False)
    x = _x(11).detach()
    mask = torch.zeros(2, 11, dtype=torch.bool)
    mask[1, 7:] = True
    y = layer(x, key_padding_mask=mask)
    x2 = x.clone()
    x2[1, 7:] = 100.0
    y2 = layer(x2, key_padding_mask=mask)
    assert torch.isfinite(y2).all()
    torch.testing.assert_close(y2[1, :7], y[1, :7])


def test_zero_is_off_and_the_attribute_can_be_set_later():
    layer = _layer("alibi", blocks=0)
    assert layer.attention_blocks is None
    x = _x(12).detach()
    full = layer(x)
    layer.attention_blocks = N
    assert not torch.allclose(layer(x), full)


@pytest.mark.parametrize("build,match", [
    (lambda: MultiHeadAttention(C, H, attention="performer", attention_blocks=N), "attention_blocks.*performer"),
    (lambda: MultiHeadAttention(C, H, attention="softmax", window=8, attention_blocks=N),
     r"attention_blocks \(4\).*window \(8\)"),
    (lambda: MultiHeadAttention(C, H, attention="softmax", decay="gated", attention_blocks=N),
     "attention_blocks.*'gated'"),
    (lambda: MultiHeadAttention(C, H, attention="softmax", positional=PathEncoding(C, H), attention_blocks=N),
     "attention_blocks.*PaTH"),
    (lambda: MultiHeadAttention(C, H, attention="softmax", attention_blocks=-1), "attention_blocks.*-1"),
])
def test_refusals_name_attention_blocks(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_a_window_is_refused_once_blocks_are_set():
    layer = _layer()
    with pytest.raises(ValueError, match=r"window \(6\).*attention_blocks \(4\)"):
        layer.window = 6


def test_model_config_takes_blocks_and_refuses_them_with_a_window_or_a_linear_kernel():
    config = ModelConfig(vocab_size=11, d_model=C, num_heads=H, num_layers=1, d_ff=16, attention="softmax",
                         positional="music-relative", max_distance=7, attention_blocks=N)
    assert config.to_dict()["attention_blocks"] == N
    assert ModelConfig.from_dict(config.to_dict()).attention_blocks == N
    assert "attention_blocks" not in ModelConfig(vocab_size=11, attention="softmax").to_dict()
    model = DecoderLM(config).double().eval()
    assert all(block.attn.attention_blocks == N for block in model.blocks)
    with pytest.raises(ValueError, match=r"attention_blocks \(4\).*window \(8\)"):
        ModelConfig(vocab_size=11, attention="softmax", positional="rope", attention_window=8, attention_blocks=N)
    with pytest.raises(ValueError, match="attention_blocks.*performer"):
        ModelConfig(vocab_size=11, attention="performer", positional="rope", attention_blocks=N)
    with pytest.raises(ValueError, match="attention_blocks.*True"):
        ModelConfig(vocab_size=11, attention="softmax", positional="rope", attention_blocks=True)


@pytest.mark.parametrize("positional", ["sinespe-exact", "shaw", "music-relative", "alibi", "rope", "sinespe", "ape"])
def test_a_model_prefills_and_decodes_as_its_forward(positional):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=30, d_model=C, num_heads=H, num_layers=2, d_ff=32, attention="softmax",
                         positional=positional, attention_blocks=N, num_realizations=R, dropout=0.0)
    model = DecoderLM(config).double().eval()
    tokens = torch.randint(0, 30, (2, 13), generator=torch.Generator().manual_seed(2))
    logits = model(tokens)
    prompt, state = model.prefill(tokens[:, :6])
    steps = []
    for t in range(6, 13):
        out, state = model.step(tokens[:, t], state)
        steps.append(out)
    torch.testing.assert_close(torch.cat([prompt, torch.stack(steps, dim=1)], dim=1), logits)


def test_the_spe_oracle_in_blocks_is_its_masked_scores():
    """sinespe-exact forms its scores from q and k (no q-only bias): the window path (its attend on
    each block's keys) against the L x L path of attention_weights (its scores, the block mask)."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=30, d_model=C, num_heads=H, num_layers=1, d_ff=32, attention="softmax",
                         positional="sinespe-exact", attention_blocks=N, dropout=0.0)
    layer = DecoderLM(config).double().eval().blocks[0].attn
    x = _x(14).detach()
    w = layer.attention_weights(x, dtype=torch.float64)
    assert (w[..., 12:, :8] == 0).all() and (w[..., 12:, 8:12] > 0).all()
    _, _, v = layer.project(x, None)
    torch.testing.assert_close(layer._output(torch.einsum("bhmn,bnhd->bmhd", w, v)), layer(x))


@pytest.mark.parametrize("positional", ["none", "music-relative", "shaw", "alibi"])
def test_no_tensor_of_l_by_l_forward_or_backward(positional):
    """Memory O(L·N): at L = 1,024 and N = 4 no operation makes a tensor of L² elements or more
    (full attention's scores alone would be B·H·L² = 2 L²)."""
    layer = _layer(positional).float()
    n = 1024
    x = torch.randn(1, n, C, requires_grad=True)
    with LargestTensor() as probe:
        layer(x).square().sum().backward()
    assert probe.largest < n * n // 8, probe.largest

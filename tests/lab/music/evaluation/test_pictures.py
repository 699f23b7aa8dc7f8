"""Offline attention matrices and the report's pictures: values checked against the model, valid PNGs."""

import math

import numpy as np
import pytest
import torch

from spe.lab.music.evaluation.pictures import (
    plot_attention,
    plot_kernels,
    plot_piano_roll,
    plot_r_grid,
    plot_style_similarity,
)
from spe.lab.metrics.capture import attention_matrices
from spe.models import DecoderLM, ModelConfig

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _model(positional, attention="performer", **kw):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=20, d_model=32, num_layers=2, num_heads=2, d_ff=64, dropout=0.0,
                         positional=positional, attention=attention, num_realizations=8, **kw)
    return DecoderLM(config).eval()


def _assert_png(path):
    data = path.read_bytes()
    assert len(data) > len(PNG_SIGNATURE) and data[:8] == PNG_SIGNATURE


TOKENS = torch.tensor([3, 7, 7, 1, 19, 0, 4, 4, 12, 5, 9, 2])


@pytest.mark.parametrize("positional,attention", [
    ("sinespe", "performer"), ("convspe", "linear-elu"), ("ape", "performer"), ("rope", "softmax"),
    ("alibi", "softmax"), ("shaw", "softmax"), ("music-relative", "softmax")])
def test_attention_rows_are_causal_distributions(positional, attention):
    a = attention_matrices(_model(positional, attention), TOKENS, layer=-1)
    n = len(TOKENS)
    assert a.shape == (2, n, n) and a.dtype == torch.float64
    assert (a[:, torch.ones(n, n, dtype=torch.bool).triu(1)] == 0).all()
    torch.testing.assert_close(a.sum(-1), torch.ones(2, n, dtype=torch.float64), rtol=0, atol=1e-12)


def test_attention_without_positional_encoding_is_softmax_of_the_layer_weights():
    model = _model("none", "softmax")
    seen = {}
    handle = model.blocks[1].norm1.register_forward_hook(lambda mod, args, out: seen.setdefault("x", out))
    with torch.no_grad():
        model(TOKENS[None])
    handle.remove()
    # Independent recomputation in float64 from the qkv weights: rows 0..C-1 are queries, C..2C-1 keys.
    x, w = seen["x"][0].double(), model.blocks[1].attn.qkv.weight.double()
    q, k = (x @ w[:32].T).view(-1, 2, 16), (x @ w[32:64].T).view(-1, 2, 16)  # (L, H, D)
    logits = torch.einsum("mhd,nhd->hmn", q, k) / math.sqrt(16)
    n = len(TOKENS)
    expected = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf).softmax(-1)
    torch.testing.assert_close(attention_matrices(model, TOKENS, layer=1), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("positional", ["sinespe", "rope", "alibi", "shaw", "music-relative"])
def test_softmax_attention_reproduces_the_layer_output(positional):
    # For softmax models the offline matrix is the layer's own attention: A·v (+ Shaw's value
    # term) through the output projection must give what the layer returned in the forward pass.
    model = _model(positional, "softmax", max_distance=4)
    attn = model.blocks[0].attn
    seen = {}
    handles = [model.blocks[0].norm1.register_forward_hook(lambda m, a, out: seen.setdefault("x", out)),
               attn.register_forward_hook(lambda m, a, out: seen.setdefault("y", out))]
    with torch.no_grad():
        model(TOKENS[None])
        for h in handles:
            h.remove()
        v = attn.qkv(seen["x"]).view(1, len(TOKENS), 3, 2, 16)[0, :, 2].double()  # (L, H, D)
        a = attention_matrices(model, TOKENS, layer=0)
        y = torch.einsum("hmn,nhd->mhd", a, v)
        if positional == "shaw":
            enc = attn.score_encoding
            rel_values = enc.rel_values.double()[enc._index(len(TOKENS), len(TOKENS), 0, torch.device("cpu"))]
            y = y + torch.einsum("hmn,mnd->mhd", a, rel_values)
        out = attn.out(y.reshape(len(TOKENS), -1).float())
    torch.testing.assert_close(out, seen["y"][0], rtol=1e-4, atol=1e-5)


def test_attention_errors():
    with pytest.raises(ValueError, match="RoPE"):
        attention_matrices(_model("rope", "linear-elu"), TOKENS)
    with pytest.raises(ValueError, match="layer"):
        attention_matrices(_model("ape"), TOKENS, layer=2)
    with pytest.raises(ValueError, match="one non-empty sequence"):
        attention_matrices(_model("ape"), torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.slow
def test_plot_kernels_shows_the_encoding_kernel(tmp_path):
    with pytest.raises(ValueError, match="SPE model"):
        plot_kernels(_model("ape"), tmp_path / "k.png")
    model = _model("sinespe", gated=False)
    values = plot_kernels(model, tmp_path / "k.png", max_lag=10)
    _assert_png(tmp_path / "k.png")
    with torch.no_grad():
        expected = model.encoding.kernel(torch.arange(-10, 11)).double().numpy()
    assert values.shape == (2, 16, 21)
    np.testing.assert_allclose(values, expected, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_plot_kernels_applies_the_layer_gate(tmp_path):
    model = _model("convspe", kernel_size=5, gated=True)
    with torch.no_grad():
        model.blocks[1].attn.spe_filter.gate_logits.normal_()
        gate = model.blocks[1].attn.spe_filter.gate.double().numpy()[..., None]
        p = model.encoding.kernel(torch.arange(-6, 7)).double().numpy()
    values = plot_kernels(model, tmp_path / "k.png", max_lag=6, layer=-1)
    np.testing.assert_allclose(values, (1 - gate) * p + gate, rtol=0, atol=1e-12)
    # convSPE vanishes beyond its filter length: only the gate's constant remains.
    np.testing.assert_allclose(values[..., 0], gate[..., 0], rtol=0, atol=1e-12)


@pytest.mark.slow
def test_plot_attention_draws_each_layer_once(tmp_path):
    model = _model("sinespe")
    maps = plot_attention(model, TOKENS, tmp_path / "a.png", layers=(0, 1, -1), training_length=6)
    _assert_png(tmp_path / "a.png")
    assert sorted(maps) == [0, 1]
    np.testing.assert_allclose(maps[1], attention_matrices(model, TOKENS, layer=1).numpy())
    plot_attention(model, TOKENS, tmp_path / "log.png", heads=[1], scale="log")
    _assert_png(tmp_path / "log.png")
    with pytest.raises(ValueError, match="scale"):
        plot_attention(model, TOKENS, tmp_path / "x.png", scale="cubic")
    with pytest.raises(ValueError, match="heads"):
        plot_attention(model, TOKENS, tmp_path / "x.png", heads=[2])


@pytest.mark.slow
def test_plot_piano_roll(tmp_path):
    from conftest import write_midi

    midi = write_midi(tmp_path / "piece.mid", notes=20)
    _assert_png(plot_piano_roll(midi, tmp_path / "roll.png", prompt_end=4.0))
    with pytest.raises(ValueError, match="cannot read"):
        plot_piano_roll(tmp_path / "missing.mid", tmp_path / "x.png")


@pytest.mark.slow
def test_plot_r_grid_and_style_similarity(tmp_path):
    grid = {"label": "sinespe", "trained": [4, 16], "test": [4, 16], "within": [[1.0, 1.2], [1.1, 0.9]],
            "beyond": [[1.5, float("nan")], [1.4, 1.0]]}
    _assert_png(plot_r_grid(grid, tmp_path / "r.png"))
    with pytest.raises(ValueError, match="shape"):
        plot_r_grid({**grid, "beyond": [[1.0, 2.0]]}, tmp_path / "x.png")
    rows = [{"label": "a", "onset_duration": [0.9, 0.8, 0.7, 0.6], "time_pitch": [0.5, 0.5, 0.4, 0.4]},
            {"label": "b", "onset_duration": [0.9, 0.9, 0.9, 0.9], "time_pitch": [0.6, 0.6, 0.6, 0.6]}]
    _assert_png(plot_style_similarity(rows, tmp_path / "s.png"))
    with pytest.raises(ValueError, match="same, non-zero number of parts"):
        plot_style_similarity([rows[0], {**rows[1], "time_pitch": [0.1]}], tmp_path / "x.png")

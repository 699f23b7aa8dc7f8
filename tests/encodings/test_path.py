"""--positional path: PaTH's directions from the layer's input, the layer's output against the
float64 definition (with and without FoX's gate), decoding == the parallel forward in the
decoder LM, and the refusals (linear kernels, encoders, windows, a foreign cache)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from spe.attention import MultiHeadAttention
from spe.encodings.path import PathEncoding, PathTerm
from spe.encodings.registry import positional_spec
from spe.encodings.short_conv import depthwise_conv_reference
from spe.lab.cli.main import main
from spe.models import ClassifierConfig, DecoderLM, ModelConfig
from spe.ops import KVCache
from spe.ops.path import chunk as path_chunk
from spe.ops.path import flash, path_attention_reference

C, HEADS = 16, 2
TINY = dict(vocab_size=30, d_model=C, num_layers=2, num_heads=HEADS, d_ff=32, dropout=0.0,
            attention="softmax", positional="path")


def _layer(decay="none"):
    torch.manual_seed(0)
    layer = MultiHeadAttention(C, HEADS, attention="softmax",
                               positional=positional_spec("path").build_layer_module(ModelConfig(**TINY)),
                               decay=decay)
    with torch.no_grad():  # gates away from their start, β spread over (0, 2)
        layer.score_encoding.beta_proj.weight.mul_(8)
        if decay == "gated":
            layer.decay_gate.weight.normal_(0, 1)  # 0 at the start: gates that depend on x
    return layer


def test_directions_are_fla_s_normalised_convolved_low_rank_projection_and_two_sigmoid_beta():
    encoding = PathEncoding(C, HEADS)
    x = torch.randn(2, 9, C, generator=torch.Generator().manual_seed(0))
    w, beta, cache = encoding.directions(x)
    raw, expected_cache = depthwise_conv_reference(encoding.w_proj(x), encoding.w_conv.weight)
    expected_w = F.normalize(F.silu(raw).float().view(2, 9, HEADS, C // HEADS), dim=-1)
    torch.testing.assert_close(w, expected_w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(beta, 2 * torch.sigmoid(encoding.beta_proj(x)))
    torch.testing.assert_close(cache, expected_cache.float())
    assert encoding.w_proj[0].out_features == 32  # fla's low rank
    assert bool((beta > 0).all() and (beta < 2).all())


@pytest.mark.parametrize("decay", ["none", "gated"])
def test_the_layer_is_path_attention_of_its_projections_and_gate(decay):
    # PaTH-FoX: the layer's own FoX gate enters the logits (refused for other score encodings)
    layer = _layer(decay)
    x = torch.randn(2, 21, C, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        q, k, v = layer.project(x, None)
        w, beta, _ = layer.score_encoding.directions(x)
        gate = layer.log_decay(x)
        assert (gate is None) == (decay == "none")
        y = path_attention_reference(*(t.double() for t in (q, k, v, w, beta)),
                                     log_decay=None if gate is None else gate.double())
        torch.testing.assert_close(layer(x).double(), layer.out.double()(y.flatten(2)), rtol=1e-5, atol=1e-6)
        weights = layer.attention_weights(x, dtype=torch.float64)
        weighted = torch.einsum("bhmn,bnhe->bmhe", weights, v.double())
        torch.testing.assert_close(weighted, y, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("decay", ["none", "gated"])
def test_the_layer_gives_the_same_output_and_gradients_with_either_form(decay, monkeypatch):
    # path_attention takes the flash-style form from FLASH_MIN_LENGTH positions on: the layer's
    # output and its gradients are the same function either way
    layer = _layer(decay)
    x = torch.randn(2, 70, C, generator=torch.Generator().manual_seed(3), requires_grad=True)
    calls, original = [], flash.flash_path_attention
    monkeypatch.setattr(path_chunk, "flash_path_attention", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    results = []
    for threshold in (10**9, 1):  # the chunked form, then the flash-style one
        monkeypatch.setattr(path_chunk, "FLASH_MIN_LENGTH", threshold)
        y = layer(x)
        results.append((y, *torch.autograd.grad(y.square().sum(), [x, *layer.parameters()], allow_unused=True)))
    assert len(calls) == 1
    for chunked, flashed in zip(*results):
        if chunked is not None:
            torch.testing.assert_close(flashed, chunked, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("options", [
    {"decay": "none"}, {"decay": "gated"},
    # PaTH-FoX in FoX-Pro's block after a short convolution of q, k, v: states wrapped around its cache
    {"decay": "gated", "qk_norm": True, "kv_shift": True, "output_gate": True, "output_norm": True,
     "short_conv": 4},
], ids=["path", "path-fox", "path-fox-pro-conv"])
def test_decoding_equals_the_parallel_forward_in_the_decoder_lm(options):
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(**TINY, **options)).eval()
    tokens = torch.randint(0, 30, (2, 19), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(tokens)
        state, steps = None, []
        for t in range(19):
            logits, state = model.step(tokens[:, t], state)
            steps.append(logits)
        torch.testing.assert_close(torch.stack(steps, 1), full, rtol=1e-5, atol=1e-5)
        prompt, state = model.prefill(tokens[:, :8])  # a prompt in one pass, then steps
        torch.testing.assert_close(prompt, full[:, :8], rtol=1e-5, atol=1e-5)
        for t in range(8, 19):
            logits, state = model.step(tokens[:, t], state)
            torch.testing.assert_close(logits, full[:, t], rtol=1e-5, atol=1e-5)


def test_the_model_trains_through_every_path_parameter():
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(**TINY, decay="gated"))
    tokens = torch.randint(0, 30, (2, 12))
    F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    encoding = model.blocks[0].attn.score_encoding
    for name, p in encoding.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_linear_kernels_encoders_and_windows_are_refused(tmp_path, capsys):
    for attention in ("performer", "linear-elu", "linear"):
        with pytest.raises(ValueError, match=r"positional 'path' .*use attention 'softmax'"):
            ModelConfig(**{**TINY, "attention": attention})
    assert main(["train", "--positional", "path", "--attention", "linear", "--out", str(tmp_path / "r"),
                 "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'path'" in err[0] and "softmax" in err[0]
    with pytest.raises(ValueError, match="causal only"):
        ClassifierConfig(**{k: v for k, v in TINY.items() if k != "vocab_size"}, vocab_size=30, num_classes=3)
    with pytest.raises(ValueError, match="window"):
        DecoderLM(ModelConfig(**TINY)).set_attention_window(8)


def test_a_plain_kv_cache_is_refused_by_a_path_step():
    layer = _layer()
    x = torch.randn(1, 1, C)
    plain = KVCache(keys=torch.zeros(1, 1, HEADS, C // HEADS), values=torch.zeros(1, 1, HEADS, C // HEADS),
                    position=1)
    with pytest.raises(TypeError, match="PathCache"):
        layer.step(x, None, plain)
    assert isinstance(layer.score_encoding.for_input(x), PathTerm)


def test_the_benchmark_decodes_a_path_layer_from_its_own_cache_type():
    from spe.lab.bench.worker import measure_generate
    case = {"positional": "path", "attention": "softmax", "impl": "-", "num_heads": 2, "head_dim": 4,
            "num_realizations": 4, "num_sines": 2, "kernel_size": 4, "num_features": 8, "chunk_size": 4,
            "length": 8, "decay": "gated", "batch": 1, "repeats": 1, "vocab_size": 11, "precision": "fp32"}
    assert measure_generate(case, torch.device("cpu"))["median_ms"] > 0


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:skipped")  # the fixture's broken.mid
def test_path_fox_trains_evaluates_and_generates_from_the_command_line(midi_folder, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--data", str(midi_folder), "--cache-dir", str(tmp_path / "cache"),
                 "--out", str(run), "--positional", "path", "--decay", "gated", "--seq-len", "32",
                 "--batch-size", "2", "--d-model", "32", "--num-layers", "1", "--num-heads", "2", "--steps", "2",
                 "--eval-every", "2", "--threads", "1", "--no-progress"]) == 0
    assert main(["evaluate", "--checkpoint", str(run), "--max-length", "64", "--out", str(tmp_path / "eval"),
                 "--no-progress"]) == 0
    assert main(["generate", "--checkpoint", str(run), "--length", "24", "--out", str(tmp_path / "g.mid"),
                 "--no-progress"]) == 0
    assert (tmp_path / "g.mid").stat().st_size > 0

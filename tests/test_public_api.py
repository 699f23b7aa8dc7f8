"""The public API has no traps: what ``import spe`` exports, FAVOR+ keys that carry their
scale, encoding defaults equal to the recommended model's, one checkpoint loader, and
``spe.generate``."""

from __future__ import annotations

import inspect
import subprocess
import sys
from dataclasses import fields

import pytest
import torch

import spe
from spe.checkpoint import LoadedCheckpoint
from spe.ops import (
    ScaledFeatures,
    causal_linear_attention,
    causal_linear_attention_reference,
    causal_linear_attention_with_state,
    favor_feature_map,
    favor_key_features,
    linear_attention,
    linear_attention_step,
    orthogonal_random_features,
)
from spe.ops.decay import decay_attention_reference

TINY = dict(vocab_size=50, d_model=16, num_layers=2, num_heads=2, d_ff=32)


# --- what `import spe` exports ------------------------------------------------------------


@pytest.mark.parametrize("name", spe.__all__)
def test_every_exported_name_resolves(name):
    assert getattr(spe, name) is not None


def test_the_names_a_user_needs_are_exported():
    needed = {"SineSPE", "ConvSPE", "SPEFilter", "MultiHeadAttention", "DecoderLM", "ModelConfig", "load", "save",
              "generate", "causal_linear_attention", "favor_feature_map", "favor_key_features", "ScaledFeatures"}
    assert needed <= set(spe.__all__) and len(set(spe.__all__)) == len(spe.__all__)


@pytest.mark.slow
def test_import_spe_loads_no_lab_module():
    # a fresh interpreter: this one may have imported the lab for other tests
    code = "import sys, spe; print(sorted(m for m in sys.modules if m == 'spe.lab' or m.startswith('spe.lab.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- FAVOR+ keys travel with their scale ---------------------------------------------------


def _favor(length=12, heads=4, dim=8, features=16):
    """float64 query features, key ScaledFeatures, values, and the keys' absolute features
    φ(k) = features · e^{log scale} (keys of norm ~2√E: log scales of tens of nats, far from
    float64's limits, so the absolute form is exact to rounding)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (2 * torch.randn(2, length, heads, dim, generator=g, dtype=torch.float64) for _ in range(3))
    w = orthogonal_random_features(heads, features, dim, generator=g).double()
    keys = favor_key_features(k, w)
    absolute = keys.features * torch.exp(keys.log_scale)[..., None]
    return favor_feature_map(q, w, is_query=True), keys, v, absolute


def _steps(phi_q, keys, v, **kwargs):
    state, out = None, []
    for t in range(phi_q.shape[1]):
        y, state = linear_attention_step(phi_q[:, t:t + 1], keys.positions(t) if isinstance(keys, ScaledFeatures)
                                         else keys[:, t:t + 1], v[:, t:t + 1], state, **kwargs)
        out.append(y)
    return torch.cat(out, 1)


KERNELS = {
    "causal": causal_linear_attention,
    "causal, window 5": lambda q, k, v: causal_linear_attention(q, k, v, window=5, chunk_size=4),
    "causal with state": lambda q, k, v: causal_linear_attention_with_state(q, k, v)[0],
    "causal reference": causal_linear_attention_reference,
    "non-causal": linear_attention,
    "recurrent": _steps,
    "recurrent, window 5": lambda q, k, v: _steps(q, k, v, window=5),
    "decay reference": lambda q, k, v: decay_attention_reference(q, k, v, torch.zeros(4, dtype=torch.float64)),
}


@pytest.mark.parametrize("kernel", KERNELS)
def test_key_features_passed_as_returned_give_the_attention_of_their_absolute_features(kernel):
    # The misuse of earlier versions, `causal_linear_attention(phi_q, phi_k, v)` with phi_k
    # from favor_key_features and no key_log_scale, now reads the scale from phi_k.
    phi_q, keys, v, absolute = _favor()
    fn = KERNELS[kernel]
    torch.testing.assert_close(fn(phi_q, keys, v), fn(phi_q, absolute, v))


def test_the_features_alone_are_another_attention():
    # why the scale must travel with them: this example tells the two apart by far more than rounding
    phi_q, keys, v, absolute = _favor()
    assert (causal_linear_attention(phi_q, keys.features, v) - causal_linear_attention(phi_q, absolute, v)).abs().max() > 0.1


def test_key_features_refuse_to_unpack_and_to_take_a_second_scale():
    phi_q, keys, v, _ = _favor()
    with pytest.raises(TypeError, match=r"pass it whole as phi_k .* key_log_scale=\.log_scale"):
        features, log_scale = keys
    for call in (lambda: causal_linear_attention(phi_q, keys, v, key_log_scale=keys.log_scale),
                 lambda: linear_attention(phi_q, keys, v, key_log_scale=keys.log_scale),
                 lambda: linear_attention_step(phi_q[:, :1], keys.positions(0), v[:, :1],
                                               key_log_scale=keys.log_scale[:, :1])):
        with pytest.raises(ValueError, match="own log scale.*key_log_scale=None"):
            call()
    with pytest.raises(ValueError, match=r"log_scale must have .* \(2, 3, 4\), got \(2, 3, 5\)"):
        ScaledFeatures(torch.zeros(2, 3, 4, 6), torch.zeros(2, 3, 5))


def test_features_and_their_scale_given_apart_still_work():
    phi_q, keys, v, absolute = _favor()
    torch.testing.assert_close(causal_linear_attention(phi_q, keys.features, v, key_log_scale=keys.log_scale),
                               causal_linear_attention(phi_q, absolute, v))


# --- encoding defaults are the recommended model's -----------------------------------------

# (class, constructor argument, ModelConfig field)
DEFAULT_PAIRS = [(spe.SineSPE, "num_realizations", "num_realizations"), (spe.SineSPE, "num_sines", "num_sines"),
                 (spe.SineSPE, "frequency_init", "frequency_init"), (spe.SineSPE, "noise", "code_noise"),
                 (spe.ConvSPE, "num_realizations", "num_realizations"), (spe.ConvSPE, "kernel_size", "kernel_size"),
                 (spe.SPEFilter, "gated", "gated"), (spe.SPEFilter, "gate_init", "gate_init"),
                 (spe.SPEFilter, "impl", "spe_impl")]


@pytest.mark.parametrize("cls, argument, field", DEFAULT_PAIRS, ids=[f"{c.__name__}.{a}" for c, a, _ in DEFAULT_PAIRS])
def test_encoding_defaults_equal_model_config_defaults(cls, argument, field):
    config_defaults = {f.name: f.default for f in fields(spe.ModelConfig)}
    assert inspect.signature(cls).parameters[argument].default == config_defaults[field]


def test_the_default_encodings_are_the_recommended_model_s():
    config = spe.ModelConfig(**TINY)
    assert spe.SineSPE(2, 8).num_realizations == config.num_realizations == 32
    assert spe.ConvSPE(2, 8).kernel_size == config.kernel_size == 64
    assert spe.SPEFilter(2, 8).gate is None and not config.gated


def test_models_build_their_encodings_from_the_config_not_the_class_defaults(tmp_path):
    # a checkpoint records its values: the class defaults changing cannot change a loaded model
    torch.manual_seed(0)
    config = spe.ModelConfig(**TINY, positional="convspe", num_realizations=64, kernel_size=128, gated=True)
    model = spe.DecoderLM(config).eval()
    assert (model.layer_encoding(0).num_realizations, model.layer_encoding(0).kernel_size) == (64, 128)
    assert model.blocks[0].attn.spe_filter.gate is not None
    loaded = spe.load(spe.save(model, tmp_path / "run")).model
    x = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert loaded.layer_encoding(0).kernel_size == 128 and loaded.blocks[0].attn.spe_filter.gate is not None


# --- one checkpoint loader -------------------------------------------------------------------


def test_load_returns_the_model_with_its_metadata(tmp_path):
    model = spe.DecoderLM(spe.ModelConfig(**TINY))
    spe.save(model, tmp_path / "run", metadata={"step": 5, "tokenizer": '{"pitch_range": [21, 109]}'})
    loaded = spe.load(tmp_path / "run")
    assert isinstance(loaded, LoadedCheckpoint) and isinstance(loaded.model, spe.DecoderLM)
    assert not loaded.model.training and loaded.step == 5 and loaded.config == model.config
    assert loaded.tokenizer_json == '{"pitch_range": [21, 109]}'


# --- spe.generate ----------------------------------------------------------------------------


def test_generate_is_exported_documented_and_names_its_errors(tmp_path):
    assert spe.generate is spe.generation.generate
    doc = inspect.getdoc(spe.generate)
    assert all(part in doc for part in ("Args:", "Returns:", "Raises:", "[0, V)"))
    model = spe.DecoderLM(spe.ModelConfig(**TINY))
    ids = spe.generate(model, [1, 2], 5, generator=torch.Generator().manual_seed(0))
    assert len(ids) == 7 and ids[:2] == [1, 2] and all(0 <= t < 50 for t in ids)
    loaded = spe.load(spe.save(model, tmp_path / "run"))
    with pytest.raises(TypeError, match="got LoadedCheckpoint: pass its .model"):
        spe.generate(loaded, [1], 3)
    with pytest.raises(ValueError, match=r"prompt ids must be integers in \[0, 50\), got \[50, -1\]"):
        spe.generate(model, [1, 50, -1], 3)

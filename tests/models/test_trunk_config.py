"""Configs: the trunk's options validated once, each model's own options added, old headers still read."""

import json
from dataclasses import fields

import pytest
import torch

from spe.checkpoint import load, save
from spe.models import ClassifierConfig, DecoderLM, EncoderClassifier, ModelConfig, TrunkConfig

SMALL = dict(vocab_size=40, d_model=16, num_layers=1, num_heads=2, d_ff=16, num_realizations=4, num_sines=2,
             kernel_size=3, num_features=8, chunk_size=4)

BAD = [{"positional": "rope2"}, {"attention": "flash"}, {"positional": "shaw", "attention": "performer"},
       {"positional": "rope", "attention": "linear-relu"}, {"d_model": 0}, {"num_heads": 3},
       {"dropout": 1.0}, {"spe_impl": "fast"}, {"num_sines": 0}, {"max_positions": -1}, {"vocab_size": True},
       {"num_realizations": 2.5}]


def _error(cls, **options) -> str:
    with pytest.raises(ValueError) as err:
        cls(**{**SMALL, **options})
    return str(err.value).removeprefix(f"{cls.__name__}: ")  # require_positive names the class


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_trunk_option_raises_the_same_error_from_every_config(bad):
    messages = {cls: _error(cls, **bad) for cls in (TrunkConfig, ModelConfig, ClassifierConfig)}
    assert len(set(messages.values())) == 1, messages
    assert any(str(value) in messages[TrunkConfig] for value in bad.values())  # the value received is named


def test_each_config_adds_its_own_options_to_the_trunk_s():
    trunk = [f.name for f in fields(TrunkConfig)]
    assert [f.name for f in fields(ModelConfig)] == trunk + ["tie_embeddings", "attention_window", "fourier_length"]
    assert [f.name for f in fields(ClassifierConfig)] == trunk + ["num_classes", "pooling", "interaction", "grid",
                                                                  "cls_id", "head_hidden"]
    # what an encoder classifier is, not an option it could be given
    assert (ClassifierConfig.causal, ClassifierConfig.attention_window, ClassifierConfig.tie_embeddings) == (
        False, None, False)
    with pytest.raises(TypeError):
        ClassifierConfig(**SMALL, attention_window=8)


def test_grid_encodings_are_the_classifier_s_without_the_base_forbidding_them():
    TrunkConfig(**SMALL, positional="convspe-2d")  # the base has no opinion on grids
    assert ClassifierConfig(**SMALL, positional="convspe-2d", grid=[3, 4]).grid == (3, 4)
    with pytest.raises(ValueError, match="2-D grid.*the images' grid"):
        ClassifierConfig(**SMALL, positional="convspe-2d")
    with pytest.raises(ValueError, match="2-D grid.*encoder classifier"):
        ModelConfig(**SMALL, positional="convspe-2d")


def test_each_config_keeps_its_own_rules():
    ClassifierConfig(**SMALL, positional="alibi", attention="softmax")  # the encoder masks their padding too
    ModelConfig(**SMALL, positional="alibi", attention="softmax")
    with pytest.raises(ValueError, match="attention_window cannot be combined"):
        ModelConfig(**SMALL, positional="alibi", attention="softmax", attention_window=8)
    with pytest.raises(ValueError, match="max_distance must be a positive integer, got 0"):
        ModelConfig(**SMALL, max_distance=0)
    assert ModelConfig(**SMALL, attention_window=0).attention_window is None


# to_dict() of the code before TrunkConfig (commit 35479dc, printed from it): checkpoint headers.
OLD_LM = {"vocab_size": 40, "d_model": 16, "num_layers": 4, "num_heads": 2, "d_ff": 1024, "dropout": 0.1,
          "positional": "convspe", "attention": "performer", "gated": True, "num_realizations": 32, "num_sines": 5,
          "kernel_size": 64, "frequency_init": "low", "code_noise": "gaussian", "gate_init": 0.0,
          "share_across_layers": True, "num_features": 64, "chunk_size": 64, "tie_embeddings": True, "code_seed": 0,
          "max_positions": 2048, "max_distance": 256, "rope_base": 10000.0, "attention_window": 16,
          "spe_impl": "auto"}
OLD_CLASSIFIER = {**OLD_LM, "positional": "convspe-2d", "gated": False, "tie_embeddings": False,
                  "attention_window": None, "num_classes": 5, "pooling": "mean", "interaction": "nli",
                  "grid": [3, 4], "cls_id": 1, "head_hidden": 0}


def test_old_config_dicts_build_the_same_configs():
    lm = ModelConfig.from_dict(OLD_LM)
    header = lm.to_dict()
    assert {k: v for k, v in header.items() if k in OLD_LM} == OLD_LM  # same values for every old field
    added = {k: v for k, v in header.items() if k not in OLD_LM}  # options added since: at their defaults
    assert added == {f.name: f.default for f in fields(ModelConfig) if f.name in added}
    classifier = ClassifierConfig.from_dict(json.loads(json.dumps(OLD_CLASSIFIER)))
    kept = {k: v for k, v in OLD_CLASSIFIER.items() if k not in ("tie_embeddings", "attention_window", "max_distance")}
    assert classifier == ClassifierConfig(**{**kept, "grid": (3, 4)})
    # max_distance was written but unused while the encoder refused score encodings; it is the
    # classifier's own option now (the same default), so old headers keep their value
    assert {k: v for k, v in classifier.to_dict().items() if k in OLD_CLASSIFIER} == {
        **kept, "grid": (3, 4), "max_distance": OLD_CLASSIFIER["max_distance"]}


def _rewrite_header(path, config: dict) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        header, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(path), metadata={**header, "spe_config": json.dumps(config)})


def test_checkpoints_with_old_headers_load(tmp_path):
    """An old header holds the classifier's unused tie_embeddings, attention_window and max_distance."""
    torch.manual_seed(0)
    small = {**SMALL, "d_ff": 16, "num_layers": 1, "kernel_size": 3}
    old_lm = {**OLD_LM, **small}
    old_classifier = {**OLD_CLASSIFIER, **small, "vocab_size": 40}
    lm = DecoderLM(ModelConfig.from_dict(old_lm)).eval()
    classifier = EncoderClassifier(ClassifierConfig.from_dict(old_classifier)).eval()
    tokens = torch.randint(2, 40, (2, 12), generator=torch.Generator().manual_seed(1))
    for name, model, config, args in (("lm", lm, old_lm, (tokens,)),
                                      ("clf", classifier, old_classifier, (tokens, None, tokens.flip(1)))):
        path = save(model, tmp_path / name)
        _rewrite_header(path, config)
        loaded = load(path).model
        assert type(loaded) is type(model) and loaded.config == model.config
        with torch.no_grad():
            assert torch.equal(loaded(*args), model(*args))


@pytest.mark.parametrize("name, value", [("code_noise", "uniform"), ("frequency_init", "high")])
def test_sine_spe_options_are_checked_when_the_config_is_built(name, value):
    """Before, a bad value surfaced only when SineSPE was built (after an LRA run had loaded its data)."""
    for config in (ModelConfig, ClassifierConfig):
        with pytest.raises(ValueError, match=f"{name} must be one of .*got '{value}'"):
            config(vocab_size=5, **{name: value})

"""Checkpoint headers are validated before anything is built: types, then sizes against the file's shapes."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import spe
from spe.checkpoint import load, load_metadata
from spe.models import ModelConfig
from spe.models.classifier_config import ClassifierConfig
from spe.models.decoder_lm import DecoderLM
from spe.models.encoder_classifier import EncoderClassifier

TINY = {"d_model": 16, "num_layers": 2, "num_heads": 2, "d_ff": 32, "num_features": 8}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(vocab_size=40, **TINY))
    return model, spe.save(model, tmp_path_factory.mktemp("ckpt") / "run",
                           metadata={"step": 3, "train": {"seq_len": 32}, "tokenizer": "{}"})


def _variant(source, folder, *, config=None, metadata=None, **entries):
    with safe_open(str(source), framework="pt") as f:
        header = dict(f.metadata())
    if config is not None:
        header["spe_config"] = json.dumps({**json.loads(header["spe_config"]), **config})
    if metadata is not None:
        header["spe_metadata"] = json.dumps({**json.loads(header["spe_metadata"]), **metadata})
    header.update(entries)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(load_file(str(source)), str(folder / "model.safetensors"), metadata=header)
    return folder / "model.safetensors"


BAD_HEADERS = [
    ({"config": {"vocab_size": "x"}}, r"header spe_config\.vocab_size must be an integer, got 'x' \(str\)$"),
    ({"config": {"vocab_size": [40]}}, r"header spe_config\.vocab_size must be an integer, got \[40\] \(list\)$"),
    ({"config": {"d_model": True}}, r"header spe_config\.d_model must be an integer, got True \(bool\)$"),
    ({"config": {"dropout": "high"}}, r"header spe_config\.dropout must be a number, got 'high' \(str\)$"),
    ({"config": {"gated": 1}}, r"header spe_config\.gated must be true or false, got 1 \(int\)$"),
    ({"config": {"attention_window": "8"}},
     r"header spe_config\.attention_window must be an integer or null, got '8' \(str\)$"),
    ({"config": {"d_ff": -3}}, r"header spe_config: ModelConfig: d_ff must be a positive integer, got -3$"),
    ({"config": {"vocab_size": 10 ** 12}},
     r"\S+ has shape \(40, 16\).*\(1000000000000, 16\).*spe_config: vocab_size = 1000000000000"),
    ({"config": {"d_ff": 2 ** 40}}, r"\S+ has shape \(32(, 16)?,?\), .*; header spe_config: d_ff = 1099511627776\)"),
    ({"config": {"d_model": 2 ** 40}}, r"header spe_config describes tensors that cannot exist \(.*overflow"),
    ({"config": {"num_layers": 10 ** 9}},
     r"spe_config\.num_layers = 1000000000.*holds \d+ tensors"),
    ({"metadata": {"step": "six"}}, r"header spe_metadata\.step must be an integer or null, got 'six' \(str\)$"),
    ({"metadata": {"step": -1}}, r"header spe_metadata\.step must be ≥ 0, got -1$"),
    ({"metadata": {"train": [32]}}, r"header spe_metadata\.train must be a JSON object, got \[32\] \(list\)$"),
    ({"metadata": {"train": {"seq_len": "32"}}},
     r"spe_metadata\.train\.seq_len .*integer.*got '32' \(str\)$"),
    ({"metadata": {"tokenizer": 5}}, r"spe_metadata\.tokenizer .*got 5 \(int\)$"),
    ({"spe_config": "[1, 2]"}, r"spe_config .*JSON object.*got \[1, 2\] \(list\)$"),
    ({"spe_config": "{oops"}, r"header entry spe_config is not valid JSON \(Expecting property name"),
    ({"spe_metadata": "null"}, r"spe_metadata .*JSON object.*got None \(NoneType\)$"),
]


@pytest.mark.parametrize(("change", "message"), BAD_HEADERS, ids=[m[:40] for _, m in BAD_HEADERS])
def test_a_bad_header_is_one_value_error_naming_the_file_and_nothing_is_allocated(saved, tmp_path, change,
                                                                                   message, monkeypatch):
    _, source = saved
    file = _variant(source, tmp_path / "bad", **change)
    built = []
    init = DecoderLM.__init__

    def recording_init(self, config):
        built.append(torch.get_default_device())
        init(self, config)

    monkeypatch.setattr(DecoderLM, "__init__", recording_init)
    with pytest.raises(ValueError, match=message) as err:
        load(tmp_path / "bad")
    assert str(err.value).startswith(f"{file}: ") or str(err.value).startswith(f"{file} ")
    # at most a skeleton on the meta device was built: no parameter storage was ever allocated
    assert all(device.type == "meta" for device in built)


def test_metadata_is_checked_by_load_metadata_too(saved, tmp_path):
    _, source = saved
    _variant(source, tmp_path / "bad", config={"vocab_size": "x"})
    with pytest.raises(ValueError, match="vocab_size must be an integer"):
        load_metadata(tmp_path / "bad")


def test_good_checkpoints_still_load_with_the_same_weights_and_random_state(saved):
    model, source = saved
    rng = torch.get_rng_state()
    loaded = load(source)
    assert all(torch.equal(a, b) for a, b in zip(loaded.model.state_dict().values(), model.state_dict().values()))
    assert loaded.step == 3 and loaded.seq_len == 32
    torch.set_rng_state(rng)


def test_classifier_checkpoints_are_checked_against_their_own_class(tmp_path):
    torch.manual_seed(0)
    model = EncoderClassifier(ClassifierConfig(vocab_size=20, num_classes=3, grid=(2, 2), positional="convspe-2d",
                                               **TINY))
    file = spe.save(model, tmp_path / "clf")
    assert isinstance(spe.load(file).model, EncoderClassifier)
    _variant(file, tmp_path / "bad", config={"num_classes": 4})
    with pytest.raises(ValueError, match=r"head\.\S+ has shape .*the configuration gives .*num_classes = 4"):
        spe.load(tmp_path / "bad")
    _variant(file, tmp_path / "grid", config={"grid": "2x2"})
    with pytest.raises(ValueError, match=r"spe_config\.grid .*got '2x2' \(str\)$"):
        spe.load(tmp_path / "grid")


def test_the_test_time_window_is_decoded_by_the_shared_helper(saved):
    _, source = saved
    loaded = load(source)
    loaded.set_window(5)
    assert loaded.config.attention_window == 5
    loaded.set_window(None)  # None keeps the window the model has
    assert loaded.config.attention_window == 5
    loaded.set_window(0)  # 0: the whole past
    assert loaded.config.attention_window is None
    with pytest.raises(ValueError, match=r"^window .*got -1$"):
        loaded.set_window(-1)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused_at_load_naming_the_tensor(saved, tmp_path, value):
    """A run that diverged wrote NaN weights: sampling ended in a torch traceback, evaluation in nulls."""
    _, source = saved
    with safe_open(str(source), framework="pt") as f:
        header = dict(f.metadata())
    state = load_file(str(source))
    state["blocks.1.attn.qkv.weight"].view(-1)[[0, 5, 7]] = value
    state["blocks.1.ffn.0.weight"][0, 0] = value
    (tmp_path / "bad").mkdir()
    file = tmp_path / "bad" / "model.safetensors"
    save_file(state, str(file), metadata=header)
    message = rf"^{file}: tensor blocks\.1\.attn\.qkv\.weight .*3 non-finite.* of 768 .*1 other tensor"
    with pytest.raises(ValueError, match=message):
        spe.load(tmp_path / "bad")

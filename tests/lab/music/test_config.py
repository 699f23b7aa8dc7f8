"""Model defaults live in the config layer: every entry point builds the same model from the same TOML."""

import warnings

import pytest
import torch
from safetensors.torch import load_file

from spe.checkpoint import load_metadata
from spe.lab.music.config import TrainConfig, load_config_file, packaged_config, resolve_model_options

# The packaged demo config with a tiny model; neither the window nor the attention is set.
TINY = {"seq_len": 16, "batch_size": 2, "steps": 1, "eval_every": 1, "threads": 1}
TINY_MODEL = {"d_model": 16, "num_layers": 1, "num_heads": 2, "d_ff": 32, "num_realizations": 4}


def _toml(positional: str) -> str:
    lines = [line for line in packaged_config("demo").read_text().splitlines()
             if line.split("=")[0].strip() not in {*TINY, *TINY_MODEL, "positional"}]
    cut = lines.index("[model]")
    top = [f"{k} = {v}" for k, v in TINY.items()]
    model = [f"{k} = {v}" for k, v in TINY_MODEL.items()] + [f'positional = "{positional}"']
    return "\n".join(lines[:cut] + top + lines[cut:] + model) + "\n"


def test_score_encodings_get_softmax_and_spe_a_window_unless_set():
    assert resolve_model_options({"positional": "shaw"}, 128)["attention"] == "softmax"
    assert resolve_model_options({"positional": "alibi", "attention": "performer"}, 128)["attention"] == "performer"
    assert "attention" not in resolve_model_options({"positional": "rope"}, 128)
    assert resolve_model_options({}, 128)["attention_window"] == 128  # sinespe is the default encoding
    assert resolve_model_options({"positional": "convspe"}, 64)["attention_window"] == 64
    assert resolve_model_options({"positional": "convspe", "attention_window": 0}, 64)["attention_window"] == 0
    assert "attention_window" not in resolve_model_options({"positional": "ape"}, 64)
    given = {"positional": "sinespe"}
    resolve_model_options(given, 64)
    assert given == {"positional": "sinespe"}  # the caller's dict is not modified
    cfg = TrainConfig(seq_len=32, model={"positional": "sinespe"})
    assert cfg.model["attention_window"] == 32 and cfg.model_config(10).attention_window == 32
    assert TrainConfig.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()  # resolving is idempotent
    assert TrainConfig(model={"positional": "sinespe", "attention_window": 0}).model_config(10).attention_window is None
    with pytest.raises(ValueError, match="alibi"):
        TrainConfig(model={"positional": "alibi", "attention": "performer"})


@pytest.mark.slow
@pytest.mark.parametrize("positional", ["sinespe", "shaw"])
def test_train_sweep_and_python_build_the_same_model_from_the_same_toml(positional, midi_folder, tmp_path):
    from spe.lab.cli.main import main
    from spe.lab.music.train import train

    toml = tmp_path / "run.toml"
    toml.write_text(_toml(positional))
    plan = tmp_path / "plan.toml"
    # a plan of one variant over the same options (keys after [model] belong to it: seeds first)
    plan.write_text("seeds = [0]\n" + _toml(positional) + "\n[variants.v]\n")
    data = ["--data", str(midi_folder), "--cache-dir", str(tmp_path / "cache")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fixture's corrupt file is reported while tokenising
        assert main(["train", "--config", str(toml), "--out", str(tmp_path / "cli"), *data, "--no-progress"]) == 0
        assert main(["sweep", "--plan", str(plan), "--out", str(tmp_path / "sweep"), *data, "--no-progress"]) == 0
        raw = load_config_file(toml)
        raw.update(out=str(tmp_path / "python"), data=str(midi_folder), cache_dir=str(tmp_path / "cache"))
        train(TrainConfig.from_dict(raw), progress=False)
    runs = [tmp_path / "cli", tmp_path / "sweep" / "v" / "seed0", tmp_path / "python"]
    metas = [load_metadata(r) for r in runs]
    configs = [m["config"] for m in metas]
    assert configs[0] == configs[1] == configs[2]
    assert configs[0]["attention"] == ("softmax" if positional == "shaw" else "performer")
    assert configs[0]["attention_window"] == (None if positional == "shaw" else 16)
    assert metas[0]["train"]["model"] == metas[1]["train"]["model"] == metas[2]["train"]["model"]
    states = [load_file(str(r / "model.safetensors")) for r in runs]
    assert states[0].keys() == states[1].keys() == states[2].keys()
    # same seed, same data, same model: the same weights after the same step
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]) and torch.equal(states[0][key], states[2][key]), key


@pytest.mark.parametrize("model,limit", [({"positional": "ape-learned", "max_positions": 64}, 64),
                                         ({"positional": "cosformer", "max_positions": 64}, 64),
                                         ({"positional": "cosformer", "cosformer_max_length": 48}, 48)])
def test_training_crops_longer_than_the_model_reaches_are_refused_before_any_data(model, limit, tmp_path):
    from spe.lab.music.config import TrainConfig

    base = {"data": str(tmp_path), "out": str(tmp_path / "run"), "model": {"attention": "performer", **model}}
    assert TrainConfig.from_dict({**base, "seq_len": limit}).seq_len == limit
    with pytest.raises(ValueError, match=rf"seq_len {limit + 1} exceeds the {limit} "):
        TrainConfig.from_dict({**base, "seq_len": limit + 1})

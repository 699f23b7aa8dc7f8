"""spe lra --model-option KEY=VALUE and --positional-lr-scale: parsing, one-line errors, default folders."""

import re

import pytest

from spe.lab.cli.main import main
from spe.lab.lra import preset_config
from spe.lab.experiment import parse_model_option
from spe.lab.lra.config import model_option_names
from spe.lab.lra.run import _check_config


@pytest.mark.parametrize("text,expected", [
    ("gated=false", ("gated", False)), ("gated=true", ("gated", True)), ("gate_init=-2", ("gate_init", -2)),
    ("gate_init=-2.5", ("gate_init", -2.5)), ("dropout=1e-1", ("dropout", 0.1)),
    ("frequency_init=spread", ("frequency_init", "spread")), ('code_noise="orthogonal"', ("code_noise", "orthogonal")),
    (" num_realizations = 64 ", ("num_realizations", 64)),
])
def test_values_are_read_as_toml_scalars_else_as_text(text, expected):
    assert parse_model_option(text) == expected


@pytest.mark.parametrize("text,message", [
    ("gated", "--model-option takes KEY=VALUE .*got 'gated'"), ("=1", "takes KEY=VALUE"),
    ("grid=[4, 4]", "--model-option grid: .*got '\\[4, 4\\]'"),
])
def test_malformed_options_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_model_option(text)


def _fake_run(seen):
    def run(cfg, seeds, out, **kw):
        seen.update(cfg=cfg, out=out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text("table\n")
        return {"mean": 17.0, "std": 0.0}

    return run


@pytest.fixture
def seen(monkeypatch, tmp_path):
    import spe.lab.lra

    found = {}
    monkeypatch.setattr(spe.lab.lra, "run_lra", _fake_run(found))
    monkeypatch.chdir(tmp_path)
    return found


def test_options_reach_the_config_and_name_the_default_folder_in_sorted_order(seen):
    argv = ["lra", "--task", "listops", "--model-option", "num_realizations=64", "--decay", "fixed",
            "--model-option", "gated=false", "--positional-lr-scale", "10"]
    assert main(argv) == 0
    cfg = seen["cfg"]
    assert (cfg.model["gated"], cfg.model["num_realizations"], cfg.model["decay"]) == (False, 64, "fixed")
    assert cfg.positional_lr_scale == 10.0
    name = "listops-performer-sinespe-decay-fixed-gated-false-num_realizations-64-positional_lr_scale-10.0"
    assert seen["out"].as_posix() == f"runs/lra/cpu-small/{name}"
    # the same options in another order: the same folder; another value: another folder
    assert main(["lra", "--task", "listops", "--positional-lr-scale", "10", "--model-option", "gated=false",
                 "--decay", "fixed", "--model-option", "num_realizations=64"]) == 0
    assert seen["out"].name == name
    assert main(["lra", "--task", "listops", "--model-option", "gated=true"]) == 0
    assert seen["out"].name == "listops-performer-sinespe-gated-true"


def test_folders_without_options_keep_their_names(seen):
    for extra, name in (([], "listops-performer-ape"), (["--decay", "none"], "listops-performer-ape"),
                        (["--decay", "learned"], "listops-performer-ape-decay-learned"),
                        (["--listops-pipeline", "lra-2021"], "listops-performer-ape-lra-2021")):
        assert main(["lra", "--task", "listops", "--positional", "ape", *extra]) == 0
        assert seen["out"].as_posix() == f"runs/lra/cpu-small/{name}"
        assert seen["cfg"].positional_lr_scale == 1.0


def test_text_values_are_made_safe_for_a_folder_name(seen):
    assert main(["lra", "--task", "listops", "--model-option", 'spe_impl="a/b c"']) != 0  # refused by the config
    from spe.lab.lra import default_folder

    cfg = preset_config("text", "sinespe", "performer")
    assert default_folder(cfg, {"spe_impl": "a/b c"}).name == "text-performer-sinespe-spe_impl-a_b_c"


@pytest.mark.parametrize("option,message", [
    ("foo=1", "unknown model option foo=1; allowed: attention_blocks, chunk_size, .*gate_init, gated, "),
    ("gated=3", "model option gated .*true or false.*got 3"),
    ("num_realizations=0", "model option num_realizations=0: .*positive integer.*got 0"),
    ("gate_init=high", "model option gate_init .*number.*got 'high'"),
    ("pooling=max", "model option pooling='max': .*cls, mean"),
    ("vocab_size=3", "unknown model option vocab_size=3; .*data"),
    ("positional=ape", "unknown model option positional='ape'; .*--positional"),
])
def test_bad_options_are_one_line_errors_naming_key_value_and_what_is_allowed(seen, capsys, option, message):
    assert main(["lra", "--task", "listops", "--model-option", option]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spe lra: error: ") and len(err.strip().splitlines()) == 1
    assert re.search(message, err), err
    assert "cfg" not in seen  # nothing ran


def test_contradicting_values_are_refused(seen, capsys):
    assert main(["lra", "--task", "listops", "--decay", "fixed", "--model-option", "decay=learned"]) == 2
    assert "--model-option decay='learned' contradicts --decay fixed" in capsys.readouterr().err
    assert main(["lra", "--task", "listops", "--model-option", "gated=true", "--model-option", "gated=false"]) == 2
    assert "contradicts --model-option gated=True" in capsys.readouterr().err


def test_every_classifier_option_but_those_of_the_data_is_settable():
    names = model_option_names()
    assert {"gated", "gate_init", "num_realizations", "num_sines", "frequency_init", "code_noise",
            "share_across_layers", "decay"} <= set(names)
    assert not {"vocab_size", "num_classes", "grid", "max_positions", "positional", "attention"} & set(names)


def test_the_folder_guard_sees_a_changed_model_option_or_lr_scale(tmp_path):
    _check_config(tmp_path, preset_config("listops", "sinespe", "performer", model={"gated": False}))
    with pytest.raises(ValueError, match="holds another LRA experiment \\(model .*'gated': False.*'gated': True"):
        _check_config(tmp_path, preset_config("listops", "sinespe", "performer", model={"gated": True}))
    with pytest.raises(ValueError, match="positional_lr_scale 1.0 -> 0.5"):
        _check_config(tmp_path, preset_config("listops", "sinespe", "performer", model={"gated": False},
                                              positional_lr_scale=0.5))
    _check_config(tmp_path, preset_config("listops", "sinespe", "performer", model={"gated": False}))


def test_a_stored_model_without_an_option_is_the_model_with_its_default(tmp_path):
    """Folders written before an option existed resume when the option is given at its default,
    and still refuse another value, naming only the option that differs."""
    _check_config(tmp_path, preset_config("listops", "ape", "performer"))
    _check_config(tmp_path, preset_config("listops", "ape", "performer", model={"fixed_code": False}))
    with pytest.raises(ValueError, match=r"model \{'fixed_code': False\} -> \{'fixed_code': True\}"):
        _check_config(tmp_path, preset_config("listops", "ape", "performer", model={"fixed_code": True}))


def test_a_folder_written_before_min_lr_ratio_existed_is_the_same_experiment(tmp_path):
    """config.json without min_lr_ratio reads as its default 0, the value the engine was given then;
    another value is another experiment."""
    import json

    _check_config(tmp_path, preset_config("listops", "ape", "performer"))
    stored = json.loads((tmp_path / "config.json").read_text())
    assert stored.pop("min_lr_ratio") == 0.0
    (tmp_path / "config.json").write_text(json.dumps(stored))
    _check_config(tmp_path, preset_config("listops", "ape", "performer"))
    with pytest.raises(ValueError, match="min_lr_ratio 0.0 -> 0.1"):
        _check_config(tmp_path, preset_config("listops", "ape", "performer", min_lr_ratio=0.1))

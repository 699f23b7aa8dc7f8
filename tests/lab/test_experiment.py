"""One experiment config: both tasks share the engine's options, their names, rules and defaults,
except the defaults LRA's preset names; KEY=VALUE overrides read alike on both commands."""

from dataclasses import MISSING, fields

import pytest

from spe.lab.experiment import ExperimentOptions, model_options, parse_model_option
from spe.lab.lra.config import LRAConfig
from spe.lab.music.config import TrainConfig

# The defaults LRA's experiments were run with, named in LRAConfig's docstring.
LRA_PRESET = {"batch_size": 32, "min_lr_ratio": 0.0, "feature_redraw_every": 0}


def _default(f):
    return f.default_factory() if f.default is MISSING else f.default


def test_both_tasks_take_every_engine_option_with_one_default_unless_their_preset_names_another():
    shared = {f.name: _default(f) for f in fields(ExperimentOptions)}
    music = {f.name: _default(f) for f in fields(TrainConfig)}
    lra = {f.name: _default(f) for f in fields(LRAConfig) if f.default is not MISSING or f.default_factory
           is not MISSING}
    assert {name: music[name] for name in shared} == shared
    assert {name: lra[name] for name in shared} == {**shared, **LRA_PRESET}
    assert LRAConfig.__doc__ is not None and all(name in LRAConfig.__doc__ for name in LRA_PRESET)


@pytest.mark.parametrize(("option", "value", "words"), [
    ("device", "tpu", "device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    ("lr", 0.0, "lr must be a finite number > 0, got 0.0"),
    ("steps", "10", "option steps must be"),
])
def test_an_engine_option_is_refused_in_the_same_words_by_both_tasks(option, value, words):
    for make in (lambda **o: TrainConfig(**o), lambda **o: LRAConfig("listops", "ape", "softmax", **o)):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            make(**{option: value})


def test_key_value_options_read_toml_scalars_and_name_both_sources_of_a_contradiction():
    assert parse_model_option("num_sines=8") == ("num_sines", 8)
    assert parse_model_option(" gated = true ") == ("gated", True)
    assert parse_model_option("frequency_init=spread") == ("frequency_init", "spread")
    assert parse_model_option("gate_init=-2.5e-1") == ("gate_init", -0.25)
    with pytest.raises(ValueError, match="takes KEY=VALUE"):
        parse_model_option("gated")
    assert model_options(["decay=fixed"], flags={"decay": "fixed"}) == {"decay": "fixed"}
    with pytest.raises(ValueError, match="--model-option decay='gated' contradicts --decay fixed"):
        model_options(["decay=gated"], flags={"decay": "fixed"})
    with pytest.raises(ValueError, match="--model-option num_sines=3 contradicts --num-sines 5"):
        model_options(["num_sines=3"], flags={"num_sines": 5})
    with pytest.raises(ValueError, match="--model-option gated=False contradicts --model-option gated=True"):
        model_options(["gated=true", "gated=false"])


def test_the_engine_s_own_defaults_are_the_shared_ones():
    from spe.lab.engine.task import EngineSettings

    shared = {f.name: _default(f) for f in fields(ExperimentOptions)}
    engine = {f.name: f.default for f in fields(EngineSettings) if f.default is not MISSING and f.name in shared}
    assert engine and engine == {name: shared[name] for name in engine}


def test_each_engine_option_is_declared_once_and_the_settings_rules_and_flags_follow_it(monkeypatch):
    import argparse
    import types

    from spe.lab.cli.main import build_parser
    from spe.lab.options import OPTION_RULES
    from spe.lab.engine.task import EngineSettings

    declared = {f.name: f for f in fields(ExperimentOptions) if f.metadata.get("engine")}
    engine = {f.name: f for f in fields(EngineSettings)}
    assert set(engine) - set(declared) == {"seed", "units_per_example"}
    assert all(engine[n].default == f.default and engine[n].type == f.type for n, f in declared.items())
    assert all(OPTION_RULES[n] is f.metadata["rule"] for n, f in declared.items() if f.metadata["rule"])
    # help changed in the declaration reaches the flags: the parsers read it when they are built
    changed = types.MappingProxyType({**declared["lr"].metadata, "help": "CHANGED"})
    monkeypatch.setattr(declared["lr"], "metadata", changed)
    declared["lr"] = next(f for f in fields(ExperimentOptions) if f.name == "lr")
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command, own_words in (("train", set()), ("lra", {"steps", "batch_size", "eval_every", "device",
                                                         "positional_lr_scale", "tensorboard", "keep_checkpoints",
                                                         "compile"})):
        actions = {a.dest: a for a in sub.choices[command]._actions}
        for name in set(declared) & set(actions):
            flag = actions[name]
            assert flag.option_strings[0] == "--" + name.replace("_", "-")
            assert isinstance(flag, argparse._StoreTrueAction) == (declared[name].type == "bool")
            assert flag.type is {"int": int, "float": float}.get(declared[name].type)
            if name not in own_words:
                assert flag.help.startswith(declared[name].metadata["help"]), (command, name)
    assert sub.choices["train"]._option_string_actions["--lr"].help.startswith("CHANGED")

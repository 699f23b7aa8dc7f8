"""EngineSettings.from_options: the one mapping from spe train's and spe lra's options to the engine's.

Every engine setting is read from the configuration (the option of the same name) or given
explicitly, never left to a default, so that an engine option cannot be forgotten by one task;
the settings of the packaged configs are what the two hand-written mappers gave; the options
the tasks share have the same names and rules on both configurations.
"""

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from tiny_run import tiny_config

from spe.lab.lra.config import PRESETS, LRAConfig, preset_config
from spe.lab.lra.task import engine_settings as lra_settings
from spe.lab.options import OPTION_RULES, SCHEDULES
from spe.lab.engine import optim
from spe.lab.music.config import TrainConfig, load_config_file, packaged_config
from spe.lab.engine.task import EngineSettings
from spe.lab.music.task import engine_settings as lm_settings

ENGINE_FIELDS = [f.name for f in dataclasses.fields(EngineSettings)]
LRA_TASKS = ("listops", "text", "retrieval", "image")


def _demo() -> TrainConfig:
    return TrainConfig.from_dict(load_config_file(packaged_config("demo")))


def _lra(task="listops", preset="cpu-small", **overrides) -> LRAConfig:
    return preset_config(task, "sinespe", "performer", preset=preset, **overrides)


def _field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


# --- every setting read or set ------------------------------------------------------------------

def test_each_engine_setting_is_an_option_of_both_configs_but_those_each_mapper_sets():
    """A new EngineSettings field fails here until both configs have it (or a mapper sets it)."""
    assert set(ENGINE_FIELDS) - _field_names(TrainConfig) == {"units_per_example"}  # = seq_len
    assert set(ENGINE_FIELDS) - _field_names(LRAConfig) == {"seed", "units_per_example"}  # per run; 1


def test_from_options_reads_same_named_attributes_and_takes_the_rest_explicitly():
    values = {"steps": 3, "batch_size": 2, "lr": 0.5, "warmup_steps": 0, "eval_every": 1, "weight_decay": 0.0,
              "grad_clip": 0.0, "schedule": "rsqrt", "min_lr_ratio": 0.25, "device": "cpu", "precision": "bf16",
              "tensorboard": True, "keep_checkpoints": 4, "compile": True, "feature_redraw_every": 7,
              "positional_lr_scale": 2.0, "unrelated": "ignored"}
    settings = EngineSettings.from_options(SimpleNamespace(**values), seed=5, units_per_example=9)
    assert dataclasses.asdict(settings) == {**{k: v for k, v in values.items() if k != "unrelated"}, "seed": 5,
                                            "units_per_example": 9}


def test_from_options_refuses_a_setting_left_to_its_default():
    options = SimpleNamespace(steps=3, batch_size=2, lr=0.5, warmup_steps=0, eval_every=1)
    with pytest.raises(ValueError, match=r"\['schedule', 'min_lr_ratio', .*'compile', 'units_per_example'\].*SimpleNamespace"):
        EngineSettings.from_options(options, seed=0)


def test_from_options_refuses_a_setting_given_both_ways_and_an_unknown_one():
    cfg = _lra()
    with pytest.raises(ValueError, match=r"\['lr'\]: LRAConfig .*explicitly"):
        EngineSettings.from_options(cfg, seed=0, units_per_example=1, lr=1.0)
    with pytest.raises(ValueError, match=r"\['seq_len'\] are not engine settings"):
        EngineSettings.from_options(cfg, seed=0, units_per_example=1, seq_len=3)


@pytest.mark.parametrize("make", ["music", "lra"])
def test_every_option_read_from_a_config_reaches_the_settings(make):
    """Changing one option changes that setting: no mapper holds a value of its own (the music
    mapper once wrote schedule "cosine" whatever the configuration said)."""
    cfg = _demo() if make == "music" else _lra()
    build = lm_settings if make == "music" else (lambda c: lra_settings(c, 0))
    other = {"schedule": "rsqrt", "precision": "bf16", "device": "cuda:1"}
    read = [name for name in ENGINE_FIELDS if hasattr(cfg, name)]
    assert len(read) == len(ENGINE_FIELDS) - (1 if make == "music" else 2)
    for name in read:
        value = getattr(cfg, name)
        if isinstance(value, bool):
            new = not value
        elif isinstance(value, str):
            new = other[name]
        elif isinstance(value, int):
            new = value + 1
        else:
            new = value / 2 if value else 0.5
        settings = build(dataclasses.replace(cfg, **{name: new}))
        assert getattr(settings, name) == new, name


# --- the settings are what the hand-written mappers gave ----------------------------------------

def test_the_music_settings_of_the_main_job_are_those_of_before():
    """The hand-written mapper, written out: every option of its name, schedule "cosine" (it had no
    option), units_per_example = seq_len, positional_lr_scale at the engine's 1.0 (it set none)."""
    cfg = _demo()
    same = ("steps", "batch_size", "lr", "warmup_steps", "eval_every", "seed", "weight_decay", "grad_clip",
            "min_lr_ratio", "device", "precision", "tensorboard", "keep_checkpoints", "compile", "feature_redraw_every")
    before = {**{name: getattr(cfg, name) for name in same}, "schedule": "cosine", "units_per_example": cfg.seq_len,
              "positional_lr_scale": 1.0}
    assert (cfg.schedule, cfg.positional_lr_scale) == ("cosine", 1.0)  # the new options' defaults change nothing
    assert dataclasses.asdict(lm_settings(cfg)) == before


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("task", LRA_TASKS)
def test_the_lra_settings_of_the_presets_are_those_of_before(task, preset):
    """The hand-written mapper, written out: every option of its name, the seed, min_lr_ratio 0
    (hard-coded: it had no option), units_per_example at the engine's 1 (it set none)."""
    cfg = _lra(task, preset)
    same = ("steps", "batch_size", "lr", "warmup_steps", "eval_every", "weight_decay", "grad_clip", "schedule",
            "device", "precision", "tensorboard", "keep_checkpoints", "compile", "positional_lr_scale",
            "feature_redraw_every")
    before = {**{name: getattr(cfg, name) for name in same}, "seed": 3, "min_lr_ratio": 0.0, "units_per_example": 1}
    assert cfg.min_lr_ratio == 0.0  # the new option's default changes nothing
    assert dataclasses.asdict(lra_settings(cfg, 3)) == before


def test_the_defaults_that_differ_between_the_tasks_are_kept():
    """Named in each config's docstring: same seed, same weights as before the options were shared."""
    music, lra = TrainConfig(), LRAConfig(task="listops", positional="ape", attention="performer")
    assert (music.min_lr_ratio, lra.min_lr_ratio) == (0.1, 0.0)
    assert (music.feature_redraw_every, lra.feature_redraw_every) == (1000, 0)
    assert (music.schedule, music.positional_lr_scale) == (lra.schedule, lra.positional_lr_scale) == ("cosine", 1.0)


# --- the shared options' rules --------------------------------------------------------------------

def _train(**options) -> TrainConfig:
    return TrainConfig(**options, model={"positional": "ape", "d_model": 16, "num_layers": 1, "num_heads": 2})


def _lra_plain(**options) -> LRAConfig:
    return LRAConfig(task="listops", positional="ape", attention="performer", **options)


BASE = {"steps": 2, "batch_size": 2, "lr": 1e-3, "warmup_steps": 0, "eval_every": 1, "seed": 0}
BAD = [("schedule", "linear", "one of cosine, rsqrt"),
       ("positional_lr_scale", 0.0, r"a finite number > 0 \(1.0: the model's learning rate\)"),
       ("positional_lr_scale", -2.0, r"a finite number > 0 \(1.0: the model's learning rate\)"),
       ("positional_lr_scale", math.inf, r"a finite number > 0 \(1.0: the model's learning rate\)"),
       ("positional_lr_scale", math.nan, r"a finite number > 0 \(1.0: the model's learning rate\)"),
       ("min_lr_ratio", 1.5, r"a number in \[0, 1\]"),
       ("min_lr_ratio", -0.1, r"a number in \[0, 1\]")]


@pytest.mark.parametrize("make", [_train, _lra_plain, lambda **o: EngineSettings(**BASE, **o)],
                         ids=["TrainConfig", "LRAConfig", "EngineSettings"])
@pytest.mark.parametrize(("option", "value", "allowed"), BAD)
def test_a_shared_option_is_refused_in_the_same_words_everywhere(make, option, value, allowed):
    with pytest.raises(ValueError, match=rf"^{option} must be {allowed}, got {value!r}$"):
        make(**{option: value})


@pytest.mark.parametrize(("option", "value"), [("schedule", 1), ("positional_lr_scale", "2"),
                                               ("positional_lr_scale", True), ("min_lr_ratio", "0")])
def test_a_shared_option_of_the_wrong_type_is_refused_by_the_type_checker(option, value):
    with pytest.raises(ValueError, match=f"training option {option} must be .*, got {value!r}"):
        _train(**{option: value})
    with pytest.raises(ValueError, match=f"LRA option {option} must be .*, got {value!r}"):
        _lra_plain(**{option: value})


def test_the_bounds_are_accepted_and_a_scale_is_stored_as_a_float():
    assert _train(schedule="rsqrt", positional_lr_scale=10).positional_lr_scale == 10.0
    assert isinstance(_train(positional_lr_scale=10).positional_lr_scale, float)
    assert isinstance(_lra_plain(positional_lr_scale=10).positional_lr_scale, float)
    assert (_lra_plain(min_lr_ratio=1).min_lr_ratio, _lra_plain(min_lr_ratio=0.0).min_lr_ratio) == (1, 0.0)


def test_one_list_of_schedules_and_one_message_for_a_learning_rate_scale():
    assert optim.SCHEDULES is SCHEDULES == OPTION_RULES["schedule"].choices
    for value in (0.0, -1.0, math.nan):  # the optimizer's own check says what the option's rule says
        with pytest.raises(ValueError) as rule:
            _lra_plain(positional_lr_scale=value)
        with pytest.raises(ValueError) as check:
            optim.check_lr_scale(value)
        assert str(rule.value) == str(check.value)


# --- the music task trains with the options it gained --------------------------------------------

@pytest.mark.slow
def test_spe_train_trains_with_the_rsqrt_schedule_and_a_positional_lr_scale(tmp_path):
    from spe.lab.music.train import train

    cfg = tiny_config(tmp_path, "run", steps=3, warmup_steps=1, eval_every=3, schedule="rsqrt",
                      positional_lr_scale=0.25, model={"positional": "sinespe"})
    train(cfg, progress=False)
    groups = torch.load(tmp_path / "run" / "train_state.pt", weights_only=False)["optimizer"]["param_groups"]
    lr = cfg.lr * optim.learning_rate_factor(2, steps=3, warmup_steps=1, schedule="rsqrt")  # the third step's
    assert lr != pytest.approx(cfg.lr * optim.learning_rate_factor(2, steps=3, warmup_steps=1, min_lr_ratio=0.1))
    assert len(groups) == 3 and groups[2]["lr_scale"] == 0.25
    assert groups[0]["lr"] == groups[1]["lr"] == pytest.approx(lr) and groups[2]["lr"] == pytest.approx(0.25 * lr)

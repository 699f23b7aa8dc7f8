"""Help and defaults: every default said as resolved, one name per idea, a long warm-up warned."""

import argparse
import warnings

import pytest

from spe.lab.cli.main import build_parser
from spe.lab.lra import preset_config
from spe.lab.music.config import TrainConfig, load_config_file, packaged_config


def _subparser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _help(command: str, flag: str) -> str:
    action = next(a for a in _subparser(command)._actions if flag in a.option_strings)
    return " ".join((action.help or "").split())


DEMO = TrainConfig.from_dict(load_config_file(packaged_config("demo")))


@pytest.mark.parametrize("command", ["train", "demo"])
@pytest.mark.parametrize("flag,option", [("--steps", "steps"), ("--seq-len", "seq_len"),
                                         ("--batch-size", "batch_size"), ("--lr", "lr"),
                                         ("--warmup-steps", "warmup_steps"), ("--eval-every", "eval_every"),
                                         ("--threads", "threads"), ("--seed", "seed"),
                                         ("--keep-checkpoints", "keep_checkpoints")])
def test_train_flags_say_their_default_as_resolved_from_the_packaged_config(command, flag, option):
    value = getattr(DEMO, option)
    assert f"(default {value}, from the packaged demo config" in _help(command, flag)


def test_the_resolved_defaults_are_the_packaged_files_not_the_dataclass():
    # threads 2 and steps 500 come from demo.toml (TrainConfig's own defaults are 0 and another)
    assert "(default 2," in _help("train", "--threads") and "(default 500," in _help("train", "--steps")


@pytest.mark.parametrize("flag,option", [("--steps", "steps"), ("--batch-size", "batch_size"),
                                         ("--eval-every", "eval_every")])
def test_lra_flags_say_each_tasks_default_of_the_default_preset(flag, option):
    text = _help("lra", flag)
    for task in ("listops", "text", "retrieval", "image"):
        assert f"{task} {getattr(preset_config(task, 'sinespe', 'performer'), option)}" in text, text


@pytest.mark.parametrize("flag,option", [("--seq-len", "seq_len"), ("--steps", "steps"), ("--batch-size", "batch_size"),
                                         ("--eval-every", "eval_every"), ("--device", "device")])
def test_synth_flags_say_the_presets_default_as_resolved(flag, option):
    from spe.lab.synth import preset_config

    for task in ("flip-flop", "mqar"):
        assert f"{getattr(preset_config(task), option)}" in _help("synth", flag).split("(default ")[1]


@pytest.mark.parametrize("command", ["generate", "evaluate", "lra", "train", "synth"])
def test_every_option_has_help_text(command):
    missing = [a.option_strings for a in _subparser(command)._actions
               if a.option_strings and a.help in (None, "") and "-h" not in a.option_strings]
    assert not missing


@pytest.mark.parametrize("command,new,old,value", [("evaluate", "--attention-window", "--window", "7"),
                                                   ("generate", "--attention-window", "--window", "7"),
                                                   ("evaluate", "--eval-length", "--max-length", "64"),
                                                   ("report", "--eval-length", "--max-length", "64"),
                                                   ("lra", "--seq-len", "--max-length", "64"),
                                                   ("synth", "--seq-len", "--train-length", "64"),
                                                   ("demo", "--eval-length", "--max-length", "64")])
def test_one_name_per_idea_and_the_old_name_an_alias_that_says_the_new_one(command, new, old, value):
    parser = _subparser(command)
    required = {"evaluate": ["--checkpoint", "x"], "generate": ["--checkpoint", "x"],
                "report": ["--checkpoint", "x", "--out", "o"], "lra": [], "synth": [], "demo": []}[command]
    by_new, by_old = (vars(parser.parse_args([*required, flag, value])) for flag in (new, old))
    assert by_new == by_old and int(value) in by_new.values()
    assert _help(command, old) == f"old name of {new} (an alias)"
    unset = vars(parser.parse_args(required))  # the alias adds no default of its own
    assert set(unset) == set(by_new)


def test_the_window_error_names_the_canonical_flag_whichever_name_was_typed(capsys):
    from spe.lab.cli.main import main

    for flag in ("--window", "--attention-window"):
        assert main(["generate", "--checkpoint", "nowhere", flag, "-1"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("spe generate: error: --attention-window ") and err.endswith("got -1"), err
        assert len(err.splitlines()) == 1


@pytest.mark.parametrize("flag,default", [("--prompt-bars", "2"), ("--length", "1024"), ("--out", "generated.mid"),
                                          ("--seed", "0"), ("--top-p", "0.9"), ("--temperature", "1.2"),
                                          ("--device", "cpu")])
def test_generate_options_say_their_argparse_default(flag, default):
    action = next(a for a in _subparser("generate")._actions if flag in a.option_strings)
    assert str(action.default) == default and f"default {default}" in _help("generate", flag)


def test_a_warmup_as_long_as_the_run_is_warned_in_one_line():
    from spe.lab.engine.core import warn_long_warmup

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_long_warmup(100, 20, 1e-3)
        warn_long_warmup(19, 20, 1e-3)  # reaches its peak before the end: silent
    assert [str(w.message) for w in caught] == [
        "warmup_steps 100 ≥ steps 20: the learning rate rises for the whole run and ends at 0.0002 (peak lr 0.001), "
        "with no decay; pass --warmup-steps below 20"]


@pytest.mark.parametrize("command", ["train", "evaluate", "generate", "report", "bench", "sweep", "demo", "lra",
                                     "synth"])
def test_every_command_that_computes_takes_the_one_threads_flag(command):
    from dataclasses import fields

    from spe.lab.options import RunOptions

    threads = next(f for f in fields(RunOptions) if f.name == "threads")
    assert _help(command, "--threads").startswith(threads.metadata["help"])


@pytest.mark.parametrize("command,folder,not_plans", [("sweep", "music", {"demo"}),
                                                      ("synth", "synth", {"cpu-small"}),
                                                      ("lra", "lra", {"cpu-small", "paper"})])
def test_plan_help_lists_every_packaged_plan(command, folder, not_plans):
    from pathlib import Path

    import spe.lab

    configs = Path(spe.lab.__file__).parent / folder / "configs"
    names = {p.stem for p in configs.glob("*.toml")} - not_plans
    text = _help(command, "--plan")
    assert names and all(name in text.split(": ", 1)[1] for name in names), (names, text)

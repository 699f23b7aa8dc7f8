"""Each option declared once: every flag of a run option (RunOptions) or an engine option
(ExperimentOptions), in every command, is derived from its one declaration, and each old name
is an alias that still works and says its new name."""

import argparse
from dataclasses import fields

import pytest

from spe.lab.cli.main import build_parser, main
from spe.lab.options import ExperimentOptions, RunOptions

RUN = {f.name: f.metadata["help"] for f in fields(RunOptions)}
# ExperimentOptions' device and precision are RunOptions' fields (one declaration)
ENGINE = {f.name: f.metadata["help"] for f in fields(ExperimentOptions) if f.metadata.get("help") and f.name not in RUN}
# the commands whose --batch-size, --steps, --compile ... are the engine's (evaluate's --batch-size is
# an evaluation batch and bench's --compile a measured variant: other options of the same word)
TRAINING = ("train", "demo", "lra", "synth")


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _declared_flags(parser: argparse.ArgumentParser):
    """(action, option name) of every flag but aliases (which set no default: add_aliased)."""
    for action in parser._actions:
        if action.option_strings and action.default is not argparse.SUPPRESS:
            names = {s.lstrip("-").replace("-", "_") for s in action.option_strings} | {action.dest}
            yield action, names


def test_every_command_is_walked():
    assert set(_commands()) == {"train", "evaluate", "report", "generate", "bench", "sweep", "demo", "lra", "synth", "export", "app"}


@pytest.mark.parametrize("command", sorted(_commands()))
def test_each_run_and_engine_flag_comes_from_its_one_declaration(command):
    records = [("RunOptions", RUN)] + ([("ExperimentOptions", ENGINE)] if command in TRAINING else [])
    copied = []
    for action, names in _declared_flags(_commands()[command]):
        for record, helps in records:
            for name in names & set(helps):
                declared = getattr(action, "declared", None)
                if declared != (record, name) or not (action.help or "").startswith(helps[name]):
                    copied.append((action.option_strings, record, name))
    assert not copied, f"declared by hand instead of from the record: {copied}"


def test_the_training_length_has_one_flag_in_every_command_that_trains():
    for command in TRAINING:
        actions = [a for a, names in _declared_flags(_commands()[command]) if "seq_len" in names]
        assert [a.declared for a in actions] == [("seq_len", "seq_len")], command
        assert actions[0].option_strings == ["--seq-len"] and actions[0].help.startswith("training length L")


def test_a_flag_declared_by_hand_is_caught():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, help="threads")
    assert [names for action, names in _declared_flags(parser) if getattr(action, "declared", None) is None
            and names & set(RUN)]


def test_the_run_flags_of_all_commands_are_the_run_options_flags():
    seen = {name for parser in _commands().values() for action, names in _declared_flags(parser)
            if getattr(action, "declared", ("",))[0] == "RunOptions" for name in names}
    assert seen == set(RUN)


@pytest.mark.parametrize("argv,fact", [
    (["evaluate", "--checkpoint", "x", "--threads", "-1"], "--threads"),
    (["generate", "--checkpoint", "x", "--device", "tpu"], "--device .*'cuda:N'.*'tpu'"),
    (["generate", "--checkpoint", "x", "--seed", "-3"], "--seed .*-3"),
    (["lra", "--task", "listops", "--max-length", "0"], "--seq-len .*got 0"),
    (["synth", "--task", "flip-flop", "--batch-size", "0"], "--batch-size .*got 0"),
    (["evaluate", "--checkpoint", "x", "--num-realizations", "0"], "--num-realizations .*got 0"),
])
def test_a_flag_is_checked_by_its_options_rule_and_named_by_its_new_name(capsys, argv, fact):
    import re

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(fact, err), err


def test_synth_takes_the_training_length_as_seq_len_and_train_length_as_its_alias():
    synth = _commands()["synth"]
    assert vars(synth.parse_args(["--seq-len", "48"])) == vars(synth.parse_args(["--train-length", "48"]))
    assert synth.parse_args(["--train-length", "48"]).seq_len == 48
    alias = next(a for a in synth._actions if "--train-length" in a.option_strings)
    assert alias.help == "old name of --seq-len (an alias)"


def test_a_synth_plan_names_the_training_length_by_its_new_flag(capsys):
    assert main(["synth", "--plan", "learned-time-flip-flop-quick", "--train-length", "32"]) == 2
    err = capsys.readouterr().err
    assert "--seq-len" in err and "--train-length" not in err, err


def test_a_configs_run_options_are_the_records_fields():
    from spe.lab.lra.config import LRAConfig
    from spe.lab.synth.config import SynthConfig
    from spe.lab.music.config import TrainConfig

    for config in (ExperimentOptions, TrainConfig, LRAConfig, SynthConfig):
        for f in fields(config):
            if f.name in RUN:
                assert f.metadata.get("help") == RUN[f.name], (config.__name__, f.name)

"""Options decoded once: "window 0 means the whole past", thread counts, one rule and one default per
option (spe.models.config, spe.lab.options)."""

import re

import pytest

from spe.lab.options import MAX_THREADS, check_threads
from spe.models.config import decode_window


def test_window_zero_is_the_whole_past_and_a_positive_window_is_kept():
    assert decode_window(None) is None and decode_window(0) is None and decode_window(7) == 7


@pytest.mark.parametrize("value", [-1, True, 2.0, "8"])
def test_a_bad_window_names_the_option_and_the_value(value):
    with pytest.raises(ValueError, match=rf"^--window .*0 .*positive.*got {value!r}$"):
        decode_window(value, "--window")


@pytest.mark.parametrize("value", [-1, True, 1.5, MAX_THREADS + 1, 100000])
def test_a_bad_thread_count_names_the_option_and_the_value(value):
    check_threads(None), check_threads(0), check_threads(MAX_THREADS)
    with pytest.raises(ValueError, match=rf"^threads .*up to {MAX_THREADS}.*got {value!r}$"):
        check_threads(value)


@pytest.mark.parametrize("text,message", [
    ("[1, 2]", r"JSON array, not an object"),
    ("3", r"JSON number, not an object"),
    ('{"task": "mqar",', r"not valid JSON .*line 1, column 17"),
    (b"\xff{}", r"not UTF-8 .*offset 0"),
])
def test_a_config_json_that_is_no_json_object_is_one_line_naming_the_file(tmp_path, text, message):
    from spe.lab.options import read_json_object

    file = tmp_path / "config.json"
    file.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match=rf"^{re.escape(str(file))}.*{message}"):
        read_json_object(file, "an experiment's config")
    (tmp_path / "good.json").write_text('{"a": 1}')
    assert read_json_object(tmp_path / "good.json", "x") == {"a": 1}


def test_eval_examples_has_one_rule_for_every_task_zero_the_whole_split():
    from spe.lab.lra import preset_config as lra_config
    from spe.lab.synth import preset_config as synth_config

    assert lra_config("listops", "ape", "softmax", eval_examples=0).eval_examples == 0  # LRA: the whole split
    # synth's splits are generated: the whole split is what eval_tokens allows at L
    assert synth_config("flip-flop", eval_examples=0, eval_tokens=4096, train_length=64).eval_examples == 64
    for make in (lambda: lra_config("listops", "ape", "softmax", eval_examples=-1),
                 lambda: synth_config("flip-flop", eval_examples=-1)):
        with pytest.raises(ValueError, match=r"^eval_examples .*0: the whole split.*got -1$"):
            make()


def test_the_test_lengths_default_is_written_once():
    from spe.lab.cli.main import build_parser
    from spe.lab.synth import preset_config
    from spe.lab.synth.config import EVAL_LENGTHS, load_preset

    assert "eval_lengths" not in load_preset("cpu-small")
    assert preset_config("mqar").eval_lengths == list(EVAL_LENGTHS)
    from argparse import _SubParsersAction

    synth = next(a for a in build_parser()._actions if isinstance(a, _SubParsersAction)).choices["synth"]
    flag = next(a for a in synth._actions if "--eval-lengths" in a.option_strings)
    assert f"default {','.join(map(str, EVAL_LENGTHS))}" in flag.help

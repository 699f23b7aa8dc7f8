"""LRA's training length is seq_len, as in every task; max_length, its old name, still works in
keywords, plan rows, stored configs and the flag, and says its new name."""

import json
import logging

import pytest

from spe.lab.lra import preset_config
from spe.lab.lra.config import LRAConfig


def test_the_old_name_is_read_as_seq_len_and_says_so(caplog):
    caplog.set_level(logging.INFO)
    assert preset_config("listops", "ape", "performer", max_length=64).seq_len == 64
    assert "max_length is the old name of seq_len" in caplog.text
    assert LRAConfig.from_dict({"task": "listops", "positional": "ape", "attention": "performer",
                                "max_length": 48}).seq_len == 48
    assert LRAConfig("listops", "ape", "performer", max_length=40).seq_len == 40  # the constructor too
    with pytest.raises(ValueError, match=r"max_length is the old name of seq_len.*both"):
        preset_config("listops", "ape", "performer", max_length=64, seq_len=64)


def test_the_presets_say_seq_len_and_the_listops_generators_max_length_keeps_its_name(caplog):
    caplog.set_level(logging.INFO)
    for preset in ("cpu-small", "paper"):
        for task in ("listops", "text", "retrieval", "image"):
            cfg = preset_config(task, "ape", "performer", preset=preset)
            assert cfg.seq_len == cfg.max_length
    assert "old name" not in caplog.text  # the packaged files use the one name
    assert "max_length" in preset_config("listops", "ape", "performer").data_options


def test_a_plan_row_may_give_the_old_name(tmp_path):
    from spe.lab.plans import load_plan
    from spe.lab.lra.study import row_config

    plan = tmp_path / "p.toml"
    plan.write_text('task = "listops"\npreset = "cpu-small"\nseeds = [0]\n'
                    '[rows.a]\npositional = "ape"\nattention = "performer"\nmax_length = 64\n')
    assert row_config(load_plan(str(plan), "lra"), "a").seq_len == 64


def test_a_folder_written_before_the_rename_is_the_same_experiment(tmp_path):
    from spe.lab.lra.run import _check_config

    cfg = preset_config("listops", "ape", "performer", seq_len=64)
    old = {k: v for k, v in cfg.to_dict().items() if k != "seq_len"}
    (tmp_path / "config.json").write_text(json.dumps({**old, "max_length": 64}))
    _check_config(tmp_path, cfg)
    (tmp_path / "config.json").write_text(json.dumps({**old, "max_length": 32}))
    with pytest.raises(ValueError, match=r"seq_len 32 -> 64"):
        _check_config(tmp_path, cfg)

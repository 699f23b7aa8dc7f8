"""The plan flags every task's command shares (spe.lab.cli.plans): --plan, --only, --seeds and
--collect read, check and collect alike in spe sweep, spe lra and spe synth."""

import json

import pytest

from spe.lab.cli.main import main

PLANS = {"sweep": "tutorial", "lra": "listops-study", "synth": "learned-time-mqar-controls"}


@pytest.mark.parametrize("command", sorted(PLANS))
def test_collect_before_any_run_writes_the_results_of_nothing_and_trains_nothing(command, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["-q", command, "--plan", PLANS[command], "--out", str(out), "--collect"]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["title"] and not any((out / row).is_dir() for row in ("ape", "fox", "ape-performer"))
    assert "results: " in capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(PLANS))
def test_an_unknown_row_is_refused_naming_the_plans_rows_before_anything_is_written(command, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([command, "--plan", PLANS[command], "--out", str(out), "--only", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown row(s) nope" in err and "rows: " in err
    assert not out.exists()


@pytest.mark.parametrize("command", ["lra", "synth"])
def test_only_and_collect_need_a_plan(command, capsys):
    assert main([command, "--collect"]) == 2
    assert "give --plan" in capsys.readouterr().err

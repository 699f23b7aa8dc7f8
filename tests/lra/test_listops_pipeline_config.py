"""--listops-pipeline reaches the LRA config, the data loader and the experiment folder's config.json."""

import json

import pytest

from spe.cli.main import main
from spe.lra import LRAConfig, preset_config
from spe.lra.run import _check_config, load_splits


def test_the_pipeline_is_part_of_the_config_and_validated():
    assert preset_config("listops", "ape", "performer").listops_pipeline == "lossless"
    cfg = preset_config("listops", "ape", "performer", listops_pipeline="lra-2021")
    assert cfg.to_dict()["listops_pipeline"] == "lra-2021"
    assert LRAConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="listops_pipeline must be one of lossless, lra-2021, got 'tfds'"):
        LRAConfig(task="listops", positional="ape", attention="performer", listops_pipeline="tfds")
    with pytest.raises(ValueError, match="listops_pipeline applies to ListOps only"):
        LRAConfig(task="text", positional="ape", attention="performer", listops_pipeline="lra-2021")


def test_the_loader_gets_the_pipeline(monkeypatch):
    import spe.data.lra.tasks as tasks

    seen = {}
    monkeypatch.setattr(tasks, "load_task", lambda *a, **k: seen.update(k))
    load_splits(preset_config("listops", "ape", "performer", listops_pipeline="lra-2021"))
    assert seen["listops_pipeline"] == "lra-2021" and seen["drop_parentheses"] is True


def test_a_folder_of_one_pipeline_refuses_the_other(tmp_path):
    lossless = preset_config("listops", "ape", "performer")
    _check_config(tmp_path, lossless)
    assert json.loads((tmp_path / "config.json").read_text())["listops_pipeline"] == "lossless"
    with pytest.raises(ValueError, match="listops_pipeline 'lossless' -> 'lra-2021'"):
        _check_config(tmp_path, preset_config("listops", "ape", "performer", listops_pipeline="lra-2021"))
    # a config.json written before the option existed reads as lossless
    stored = json.loads((tmp_path / "config.json").read_text())
    del stored["listops_pipeline"]
    (tmp_path / "config.json").write_text(json.dumps(stored))
    _check_config(tmp_path, lossless)


def test_the_command_line_flag_reaches_the_run_and_names_the_default_folder(monkeypatch, tmp_path, capsys):
    import spe.lra

    seen = {}

    def fake_run(cfg, seeds, out, **kw):
        seen.update(cfg=cfg, out=out)
        out.mkdir(parents=True)
        (out / "results.md").write_text("table\n")
        return {"mean": 17.0, "std": 0.0}

    monkeypatch.setattr(spe.lra, "run_lra", fake_run)
    monkeypatch.chdir(tmp_path)
    assert main(["lra", "--task", "listops", "--positional", "ape", "--listops-pipeline", "lra-2021"]) == 0
    assert seen["cfg"].listops_pipeline == "lra-2021"
    assert str(seen["out"]).endswith("listops-performer-ape-lra-2021")
    assert main(["lra", "--task", "listops", "--positional", "ape", "--out", "x"]) == 0
    assert seen["cfg"].listops_pipeline == "lossless"
    assert main(["lra", "--task", "text", "--listops-pipeline", "lra-2021", "--out", "y"]) == 2
    assert "listops_pipeline applies to ListOps only" in capsys.readouterr().err

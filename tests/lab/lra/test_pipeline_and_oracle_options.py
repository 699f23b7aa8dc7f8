"""--listops-pipeline reaches the LRA config, the data loader and the experiment folder's config.json."""

import json

import pytest

from spe.lab.cli.main import main
from spe.lab.lra import LRAConfig, preset_config
from spe.lab.lra.run import _check_config, load_splits


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
    import spe.lab.lra.data.tasks as tasks

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
    import spe.lab.lra

    seen = {}

    def fake_run(cfg, seeds, out, **kw):
        seen.update(cfg=cfg, out=out)
        out.mkdir(parents=True)
        (out / "results.md").write_text("table\n")
        return {"mean": 17.0, "std": 0.0}

    monkeypatch.setattr(spe.lab.lra, "run_lra", fake_run)
    monkeypatch.chdir(tmp_path)
    assert main(["lra", "--task", "listops", "--positional", "ape", "--listops-pipeline", "lra-2021"]) == 0
    assert seen["cfg"].listops_pipeline == "lra-2021"
    assert str(seen["out"]).endswith("listops-performer-ape-lra-2021")
    assert main(["lra", "--task", "listops", "--positional", "ape", "--out", "x"]) == 0
    assert seen["cfg"].listops_pipeline == "lossless"
    assert main(["lra", "--task", "text", "--listops-pipeline", "lra-2021", "--out", "y"]) == 2
    assert "listops_pipeline applies to ListOps only" in capsys.readouterr().err


def test_an_spe_oracle_takes_its_spe_s_preset_options():
    for preset in ("paper", "cpu-small"):
        for exact, spe in (("sinespe-exact", "sinespe"), ("convspe-exact", "convspe")):
            a = preset_config("listops", spe, "softmax", preset=preset)
            b = preset_config("listops", exact, "softmax", preset=preset)
            assert a.model == b.model and "share_across_layers" in b.model


@pytest.mark.parametrize("positional", ["sinespe-exact", "convspe-exact", "alibi"])
def test_one_lra_training_step_with_a_score_encoding_moves_its_parameters(positional, tmp_path):
    """One step of the engine (spe lra's code path) on softmax + a score encoding: a finite loss, and
    gradients reach the attention and, for an SPE oracle, SPE's own parameters and the gate."""
    import torch
    from safetensors.torch import load_file

    from spe.lab.lra.data.dataset import SequenceDataset
    from spe.lab.lra import build_classifier, train_seed

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 11, (8,), generator=g)
    tokens = torch.randint(2, 16, (8, 10), generator=g).masked_fill(torch.arange(10)[None] >= lengths[:, None], 0)
    train = SequenceDataset(tokens, lengths, torch.randint(0, 10, (8,), generator=g), vocab_size=16, num_classes=10)
    cfg = LRAConfig(task="listops", positional=positional, attention="softmax", batch_size=4, steps=1, eval_every=1,
                    listops_pipeline="lra-2021", model={"d_model": 16, "num_heads": 2, "num_layers": 1, "d_ff": 16,
                                                        "num_sines": 2, "kernel_size": 3, "gated": True})
    torch.manual_seed(0)  # the engine builds the model of seed s right after torch.manual_seed(s)
    before = build_classifier(cfg, train).state_dict()
    train_seed(cfg, {"train": train, "val": train, "test": train}, 0, tmp_path, progress=False)
    after = load_file(str(tmp_path / "last" / "model.safetensors"))
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 1 and torch.isfinite(torch.tensor(record["train_loss"]))
    moved = {k for k, v in after.items() if not torch.equal(v, before[k])}
    assert "blocks.0.attn.qkv.weight" in moved
    if positional.endswith("-exact"):  # gradients reach SPE's own parameters and the gate
        assert any(k.startswith("encoding.") for k in moved) and "blocks.0.attn.spe_filter.gate_logits" in moved

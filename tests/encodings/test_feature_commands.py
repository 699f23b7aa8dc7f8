"""`spe train`, `spe generate`, `spe bench` and `spe lra` take lrpe, permute and cosformer."""

import json

import pytest

from spe.checkpoint import load_metadata
from spe.lab.cli.main import main

TINY = ["--seq-len", "16", "--batch-size", "2", "--d-model", "16", "--num-layers", "1", "--num-heads", "2",
        "--eval-every", "2", "--threads", "1", "--steps", "2", "--no-progress"]


@pytest.mark.parametrize("positional,extra", [("lrpe", ["--lrpe-angles", "learned"]), ("permute", []),
                                              ("cosformer", ["--cosformer-max-length", "48"])])
@pytest.mark.slow
def test_train_then_generate(midi_folder, tmp_path, positional, extra):
    run = tmp_path / positional
    with pytest.warns(UserWarning, match="broken.mid"):
        assert main(["train", "--data", str(midi_folder), "--cache-dir", str(tmp_path / "cache"), "--out", str(run),
                     "--positional", positional, *extra, *TINY]) == 0
    config = load_metadata(run)["config"]
    assert config["positional"] == positional and config["attention"] == "performer"
    if positional == "cosformer":
        assert config["cosformer_max_length"] == 48
        assert main(["generate", "--checkpoint", str(run), "--length", "60", "--out", str(tmp_path / "x.mid"),
                     "--no-progress"]) == 2  # beyond L_max: a one-line error, no traceback
    length = "40" if positional == "cosformer" else "60"
    assert main(["generate", "--checkpoint", str(run), "--length", length, "--out", str(tmp_path / "new.mid"),
                 "--no-progress"]) == 0


@pytest.mark.slow
def test_bench_measures_them_with_linear_kernels_only(tmp_path):
    out = tmp_path / "bench"
    assert main(["bench", "--lengths", "16", "--positionals", "lrpe,permute,cosformer", "--attentions",
                 "softmax,performer,linear", "--repeats", "1", "--json", str(out / "b.json"), "--out", str(out),
                 "--threads", "1", "--no-progress"]) == 0
    records = json.loads((out / "b.json").read_text())["records"]
    assert {(r["positional"], r["attention"]) for r in records} == {
        (p, a) for p in ("lrpe", "permute", "cosformer") for a in ("performer", "linear")}
    assert not [r for r in records if "skipped" in r], [r["skipped"] for r in records if "skipped" in r]
    assert {r["mode"] for r in records} == {"train", "generate"}


@pytest.mark.parametrize("positional", ["lrpe", "permute", "cosformer"])
def test_lra_presets_build_them(positional):
    from spe.lab.lra.config import preset_config

    cfg = preset_config("listops", positional, "performer", preset="cpu-small")
    assert cfg.positional == positional
    with pytest.raises(ValueError, match="softmax attention does not have"):
        preset_config("listops", positional, "softmax", preset="cpu-small")

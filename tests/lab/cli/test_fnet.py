"""FNet on the command line: spe train --attention fnet-causal (APE and the DFT length by default),
evaluate and generate on its run, spe lra --attention fnet, and every refused option as one line."""

from __future__ import annotations

import pytest

from spe.checkpoint import load_metadata
from spe.lab.cli.main import _train_config, build_parser, main
from spe.lab.labels import run_label
from spe.models import ModelConfig

TINY = ["--seq-len", "32", "--batch-size", "2", "--d-model", "32", "--num-layers", "1", "--num-heads", "2",
        "--eval-every", "2", "--threads", "1", "--no-progress"]


def test_fnet_causal_gets_ape_and_the_training_length_as_dft_length():
    def model(*flags):
        return _train_config(build_parser().parse_args(["train", "--attention", "fnet-causal", *flags])).model

    assert (model("--seq-len", "48")["positional"], model("--seq-len", "48")["fourier_length"]) == ("ape", 48)
    assert model("--model-option", "fourier_length=100")["fourier_length"] == 100
    assert model("--positional", "none")["positional"] == "none"


def test_the_run_label_names_the_dft_length():
    def label(n):
        return run_label(ModelConfig(vocab_size=20, positional="ape", attention="fnet-causal", fourier_length=n))

    assert label(32) == "ape/fnet-causal dft 32" and label(64) != label(32)


@pytest.mark.parametrize("flags,fact", [
    (["--attention", "fnet"], "'fnet-causal'"),
    (["--attention", "fnet-causal", "--positional", "rope"], "'rope'"),
    (["--attention", "fnet-causal", "--decay", "fixed"], "decay"),
    (["--attention", "fnet-causal", "--short-conv", "4"], "short_conv"),
    (["--attention", "fnet-causal", "--attention-window", "8"], "attention_window"),
    (["--attention", "fnet-causal", "--model-option", "num_features=8"], "num_features"),
    (["--attention", "fnet-causal", "--num-realizations", "8"], "num_realizations"),
    (["--attention", "fnet-causal", "--model-option", "qk_norm=true"], "qk_norm"),
    (["--attention", "softmax", "--positional", "ape", "--model-option", "fourier_length=8"], "fourier_length"),
    (["--attention", "fnet-causal", "--state-passing"], "state_passing"),
])
def test_spe_train_refuses_what_a_mixer_cannot_take_in_one_line(midi_folder, tmp_path, capsys, flags, fact):
    out = tmp_path / "run"
    assert main(["train", "--data", str(midi_folder), "--cache-dir", str(tmp_path / "cache"), "--out", str(out),
                 "--steps", "1", *TINY, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fact in err[0] and "Traceback" not in err[0]
    assert not out.exists()  # refused before any work


@pytest.mark.parametrize("flags,fact", [
    (["--attention", "fnet-causal"], "'fnet'"),
    (["--attention", "fnet", "--positional", "sinespe"], "'sinespe'"),
    (["--attention", "fnet", "--decay", "fixed"], "decay"),
])
def test_spe_lra_refuses_what_fnet_cannot_take_in_one_line(tmp_path, capsys, flags, fact):
    assert main(["lra", "--task", "listops", "--steps", "1", "--out", str(tmp_path / "lra"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fact in err[0]


@pytest.mark.slow
def test_fnet_causal_trains_evaluates_and_generates(midi_folder, tmp_path, capsys):
    run = tmp_path / "run"
    with pytest.warns(UserWarning, match="broken.mid"):
        assert main(["train", "--data", str(midi_folder), "--cache-dir", str(tmp_path / "cache"), "--out", str(run),
                     "--steps", "2", "--attention", "fnet-causal", *TINY]) == 0
    config = load_metadata(run)["config"]
    assert (config["attention"], config["positional"], config["fourier_length"]) == ("fnet-causal", "ape", 32)
    assert main(["evaluate", "--checkpoint", str(run), "--max-length", "64", "--out", str(tmp_path / "eval"),
                 "--no-progress"]) == 0
    assert "ape/fnet-causal" in capsys.readouterr().out
    out_mid = tmp_path / "gen" / "new.mid"
    assert main(["generate", "--checkpoint", str(run), "--length", "80", "--out", str(out_mid),
                 "--prompt", str(midi_folder / "piece1.mid"), "--no-progress"]) == 0
    assert out_mid.stat().st_size > 0
    assert main(["generate", "--checkpoint", str(run), "--out", str(tmp_path / "w.mid"), "--window", "8"]) == 2
    assert "window" in capsys.readouterr().err


@pytest.mark.slow
def test_spe_lra_fnet_trains_on_listops_with_ape(tmp_path):
    out = tmp_path / "lra"
    assert main(["lra", "--task", "listops", "--attention", "fnet", "--steps", "2", "--eval-every", "2",
                 "--seq-len", "64", "--batch-size", "4", "--threads", "1", "--out", str(out), "--no-progress",
                 "--model-option", "d_model=32", "--model-option", "num_layers=1", "--model-option", "d_ff=64"]) == 0
    assert '"positional": "ape"' in (out / "config.json").read_text()

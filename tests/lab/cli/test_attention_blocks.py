"""--attention-blocks N on the command line: it reaches the model, takes no default window, grows
music-relative's distance table to 2N − 1, is refused in one line where it cannot run, and the
Music Transformer (softmax + music-relative + blocks) trains, evaluates and generates."""

import logging
import re

import pytest
from tiny_run import clean_midi

from spe.lab.cli.main import _train_config, build_parser, main

TINY = ["--d-model", "32", "--num-layers", "1", "--num-heads", "2", "--batch-size", "2", "--threads", "1",
        "--warmup-steps", "1", "--no-progress"]


def _model(*flags):
    return _train_config(build_parser().parse_args(["train", *flags])).model


def test_the_flag_reaches_the_model_without_the_default_window():
    model = _model("--attention", "softmax", "--positional", "sinespe", "--attention-blocks", "32")
    assert model["attention_blocks"] == 32 and "attention_window" not in model
    assert _model("--attention", "softmax", "--positional", "sinespe")["attention_window"] is not None


def test_music_relative_reaches_the_distances_of_two_blocks_or_logs_what_is_clipped(caplog):
    assert _model("--positional", "music-relative", "--attention-blocks", "200")["max_distance"] == 399
    assert _model("--positional", "music-relative", "--attention-blocks", "64").get("max_distance") in (None, 256)
    with caplog.at_level(logging.INFO):
        model = _model("--positional", "music-relative", "--attention-blocks", "64", "--max-distance", "100")
    assert model["max_distance"] == 100
    assert "distances 101 to 127 share the embedding of max_distance 100" in caplog.text


@pytest.mark.parametrize("flags,match", [
    (["--attention-blocks", "-2"], "--attention-blocks .*-2"),
    (["--attention", "performer", "--attention-blocks", "8"], r"attention_blocks \(8\).*performer"),
    (["--attention", "softmax", "--positional", "rope", "--attention-window", "16", "--attention-blocks", "8"],
     r"attention_blocks \(8\).*window \(16\)"),
    (["--attention", "softmax", "--positional", "path", "--attention-blocks", "8"], r"attention_blocks \(8\).*PaTH"),
])
def test_refusals_are_one_line_exit_2(flags, match, tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(match, err), err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_music_transformer_trains_evaluates_and_generates(tmp_path):
    data = clean_midi(tmp_path / "midi")
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(run), "--cache-dir", str(tmp_path / "cache"),
                 "--attention", "softmax", "--positional", "music-relative", "--attention-blocks", "64",
                 "--steps", "2", "--eval-every", "2", "--seq-len", "160", *TINY]) == 0
    assert main(["evaluate", "--checkpoint", str(run), "--eval-length", "300", "--threads", "1", "--no-progress",
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "eval")]) == 0
    assert (tmp_path / "eval" / "summary.json").is_file()
    assert main(["generate", "--checkpoint", str(run), "--length", "150", "--threads", "1", "--no-progress",
                 "--out", str(tmp_path / "piece.mid")]) == 0
    assert (tmp_path / "piece.mid").stat().st_size > 0
    sine = tmp_path / "sine"
    assert main(["train", "--data", str(data), "--out", str(sine), "--cache-dir", str(tmp_path / "cache"),
                 "--attention", "softmax", "--positional", "sinespe", "--attention-blocks", "32",
                 "--steps", "2", "--eval-every", "2", "--seq-len", "96", *TINY]) == 0


def test_the_run_label_names_the_blocks():
    from spe.lab.labels import run_label

    assert run_label({"positional": "music-relative", "attention": "softmax", "attention_blocks": 64}) \
        == "music-relative/softmax blocks 64"
    assert run_label({"positional": "music-relative", "attention": "softmax", "attention_blocks": 0}) \
        == "music-relative/softmax"


def test_the_evaluation_memory_of_blocks_is_linear_in_the_length():
    from spe.lab.music.evaluation.memory import evaluation_bytes
    from spe.models import ModelConfig

    blocks = ModelConfig(vocab_size=300, attention="softmax", positional="music-relative", attention_blocks=64)
    whole = ModelConfig(vocab_size=300, attention="softmax", positional="music-relative")
    assert evaluation_bytes(blocks, 16384, 1) < evaluation_bytes(whole, 16384, 1) / 10
    assert evaluation_bytes(blocks, 16384, 1) == pytest.approx(2 * evaluation_bytes(blocks, 8192, 1), rel=1e-6)

"""CLI smoke run on a tiny configuration: train -> resume -> evaluate -> generate, and clear errors."""

import json

import pytest

from spe.checkpoint import load_metadata
from spe.lab.cli.main import main

TINY = ["--seq-len", "32", "--batch-size", "2", "--d-model", "32", "--num-layers", "1", "--num-heads", "2",
        "--num-realizations", "4", "--eval-every", "2", "--threads", "1"]


@pytest.mark.slow
def test_train_resume_evaluate_generate(midi_folder, tmp_path, capsys):
    cache, run = str(tmp_path / "cache"), tmp_path / "run"
    base = ["train", "--data", str(midi_folder), "--cache-dir", cache, "--out", str(run), *TINY, "--no-progress"]
    with pytest.warns(UserWarning, match="broken.mid"):
        assert main([*base, "--steps", "2"]) == 0
    assert load_metadata(run)["step"] == 2
    assert main([*base, "--steps", "4"]) == 2  # refuses to overwrite without --resume
    assert "--resume" in capsys.readouterr().err
    assert main([*base, "--steps", "4", "--resume"]) == 0
    meta = load_metadata(run)
    assert meta["step"] == 4 and meta["config"]["positional"] == "sinespe"
    assert (run / "loss.png").stat().st_size > 0

    evald = tmp_path / "eval"
    assert main(["evaluate", "--checkpoint", str(run), "--max-length", "64", "--out", str(evald),
                 "--json", str(evald / "buckets.json"), "--no-progress"]) == 0
    buckets = json.loads((evald / "buckets.json").read_text())["models"][0]["buckets"]
    assert [(b["start"], b["end"]) for b in buckets] == [(0, 32), (32, 64)]
    assert all(b["n"] >= 1 and b["ce"] > 0 for b in buckets)
    assert (evald / "extrapolation.png").stat().st_size > 0
    lines = (evald / "per_position.csv").read_text().splitlines()
    assert len(lines) == 65 and lines[0].endswith("unigram")
    assert "unigram" in capsys.readouterr().out
    # sineSPE trains with a window of the training length (32), which changes nothing inside
    # it; the whole past (--window 0) differs only beyond
    assert meta["config"]["attention_window"] == 32
    assert main(["evaluate", "--checkpoint", str(run), "--max-length", "64", "--out", str(tmp_path / "w"),
                 "--json", str(tmp_path / "w.json"), "--window", "0", "--no-progress"]) == 0
    whole_past = json.loads((tmp_path / "w.json").read_text())["models"][0]["buckets"]
    assert whole_past[0]["ce"] == pytest.approx(buckets[0]["ce"], rel=1e-5)
    assert whole_past[1]["ce"] != pytest.approx(buckets[1]["ce"], rel=1e-5)
    assert main(["evaluate", "--checkpoint", str(run), "--out", str(tmp_path / "w"), "--window", "-1"]) == 2
    assert "--attention-window must be" in capsys.readouterr().err  # --window: its old name

    out_mid = tmp_path / "gen" / "new.mid"
    assert main(["generate", "--checkpoint", str(run), "--length", "80", "--out", str(out_mid),
                 "--prompt", str(midi_folder / "piece1.mid"), "--window", "16", "--no-progress"]) == 0
    from symusic import Score

    score = Score(str(out_mid))
    assert sum(len(t.notes) for t in score.tracks) > 0
    assert "tokens" in capsys.readouterr().out


def test_errors_are_reported_without_traceback(tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "r"), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
    assert main(["train", "--positional", "bogus", "--out", str(tmp_path / "r"), "--steps", "1"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(tmp_path / "nothing"), "--out", str(tmp_path / "x.mid")]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_bad_flags_and_corrupt_checkpoints_are_one_line_errors(tmp_path, capsys):
    assert main(["evaluate", "--checkpoint", str(tmp_path), "--device", "tpu"]) == 2
    assert "--device" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(tmp_path), "--length", "0"]) == 2
    assert "--length must be positive" in capsys.readouterr().err
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    assert main(["generate", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "x.mid")]) == 2
    err = capsys.readouterr().err
    assert "not a readable safetensors file" in err and "Traceback" not in err


@pytest.mark.slow
def test_score_encodings_pick_softmax_unless_attention_is_given(midi_folder, tmp_path, capsys):
    cache = str(tmp_path / "cache")
    run = tmp_path / "shaw"
    not_spe = [flag for flag in TINY if flag not in ("--num-realizations", "4")]  # shaw reads no R
    assert main(["train", "--data", str(midi_folder), "--cache-dir", cache, "--out", str(run), *not_spe,
                 "--steps", "1", "--positional", "shaw", "--max-distance", "8", "--no-progress"]) == 0
    config = load_metadata(run)["config"]
    assert (config["positional"], config["attention"], config["max_distance"]) == ("shaw", "softmax", 8)
    assert main(["train", "--data", str(midi_folder), "--cache-dir", cache, "--out", str(tmp_path / "x"), *TINY,
                 "--steps", "1", "--positional", "alibi", "--attention", "performer"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "alibi" in err[0] and "softmax" in err[0]


def test_spe_models_get_a_window_of_the_training_length_unless_told_otherwise():
    from spe.lab.cli.main import _train_config, build_parser

    def model_of(*flags):
        return _train_config(build_parser().parse_args(["train", *flags])).model

    assert model_of("--seq-len", "128")["attention_window"] == 128
    assert model_of("--positional", "convspe")["attention_window"] == 256
    assert model_of("--attention-window", "0")["attention_window"] is None
    assert model_of("--attention-window", "64")["attention_window"] == 64
    assert "attention_window" not in model_of("--positional", "ape")


def test_each_encoding_option_flag_reaches_the_model_config():
    from spe.encodings.registry import encoding_flags
    from spe.lab.cli.main import _train_config, build_parser

    values = {"lrpe_angles": "learned", "spe_time": "learned", "rope_time": "learned"}  # the others are integers
    flags = []
    for i, (name, _) in enumerate(encoding_flags()):
        values.setdefault(name, 7 + i)
        flags += ["--" + name.replace("_", "-"), str(values[name])]
    model = _train_config(build_parser().parse_args(["train", "--positional", "lrpe", "--attention", "linear-elu",
                                                     *flags])).model
    assert {name: model[name] for name in values} == values


def test_spe_train_takes_any_model_option_as_key_value_and_refuses_a_contradiction():
    from spe.lab.cli.main import _train_config, build_parser

    def model_of(*flags):
        return _train_config(build_parser().parse_args(["train", *flags])).model

    model = model_of("--positional", "rope", "--model-option", "rope_base=500", "--model-option",
                     "code_noise=orthogonal", "--model-option", "gated=true")
    assert (model["rope_base"], model["code_noise"], model["gated"]) == (500, "orthogonal", True)
    assert model_of("--model-option", "positional=ape", "--model-option", "positional=ape")["positional"] == "ape"
    with pytest.raises(ValueError, match="--model-option positional='ape' contradicts --positional rope"):
        model_of("--positional", "rope", "--model-option", "positional=ape")
    with pytest.raises(ValueError, match="^model option rope_base must be a number, got .x."):
        model_of("--model-option", "rope_base=x")
    with pytest.raises(ValueError, match=r"unknown model option\(s\) \['nope'\]"):
        model_of("--model-option", "nope=1")


def test_the_packaged_thread_count_is_lowered_to_a_smaller_machines_cpus(monkeypatch):
    import spe.lab.cli.main as cli

    monkeypatch.setattr(cli, "MAX_THREADS", 1)  # demo.toml asks for 2
    assert cli._train_config(cli.build_parser().parse_args(["train"])).threads == 1
    assert cli._train_config(cli.build_parser().parse_args(["train", "--threads", "2"])).threads == 2


@pytest.mark.parametrize("command", ["evaluate", "generate", "report"])
def test_threads_reach_pytorch_in_commands_that_load_a_checkpoint(command, tmp_path, monkeypatch):
    import torch

    asked = []
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    argv = [command, "--checkpoint", str(tmp_path / "missing"), "--threads", "1", "--out", str(tmp_path / "out")]
    assert main(argv) == 2  # no checkpoint there: the threads were set before it was looked for
    assert asked == [1]

"""Outputs never replace inputs: --json and --out are checked before any work."""

import re
from pathlib import Path

import pytest
from conftest import write_midi
from tiny_run import tiny_config

import spe.lab.bench.run as bench_run
from spe.lab.cli.main import main
from spe.lab.outputs import check_output_file, check_output_folder
from spe.lab.music.train import train


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs")
    out = train(tiny_config(root, "run", steps=2), progress=False)
    write_midi(root / "prompt.mid", notes=20)
    return out


def _bytes(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize("target,message", [
    ("model.safetensors", "model.safetensors is a file this command reads"),
    ("train_state.pt", "is a training state"),
    (".", "is a folder: give a file name"),
])
@pytest.mark.slow
def test_evaluate_json_never_replaces_the_checkpoint_or_the_run(run, tmp_path, capsys, target, message):
    before = _bytes(run)
    code = main(["evaluate", "--checkpoint", str(run), "--json", str(run / target), "--out", str(tmp_path / "ev"),
                 "--max-length", "8", "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--json" in err
    assert re.search(message, err), err
    assert _bytes(run) == before
    assert not (tmp_path / "ev").exists()  # refused before evaluating


@pytest.mark.slow
def test_generate_never_writes_over_its_prompt_or_a_checkpoint(run, capsys):
    prompt = run.parent / "prompt.mid"
    before = prompt.read_bytes()
    assert main(["generate", "--checkpoint", str(run), "--prompt", str(prompt), "--out", str(prompt),
                 "--length", "4", "--no-progress"]) == 2
    assert "prompt.mid is a file this command reads" in capsys.readouterr().err
    assert prompt.read_bytes() == before
    other = run.parent / "other.mid"
    other.write_bytes((run / "model.safetensors").read_bytes())  # a checkpoint under a MIDI name
    assert main(["generate", "--checkpoint", str(run), "--out", str(other), "--length", "4", "--no-progress"]) == 2
    assert "is a checkpoint (safetensors)" in capsys.readouterr().err


def test_report_out_that_is_a_checkpoint_is_refused(run, capsys):
    before = _bytes(run)
    assert main(["report", "--checkpoint", str(run), "--out", str(run / "model.safetensors"), "--no-progress"]) == 2
    assert "is a checkpoint (safetensors), not a folder" in capsys.readouterr().err
    assert _bytes(run) == before


def test_bench_checks_its_json_before_measuring(tmp_path, monkeypatch, capsys):
    def measured(**_):
        pytest.fail("spe bench measured before checking --json")

    monkeypatch.setattr(bench_run, "run_bench", measured)
    (tmp_path / "a_file").write_text("x")
    for target, message in ((tmp_path, "is a folder: give a file name"),
                            (tmp_path / "a_file" / "bench.json", "a_file is a file, not a folder")):
        assert main(["bench", "--lengths", "16", "--json", str(target), "--out", str(tmp_path / "b")]) == 2
        assert message in capsys.readouterr().err


def test_check_output_file_accepts_new_and_replaceable_files(tmp_path):
    (tmp_path / "old.json").write_text("{}")
    assert check_output_file(tmp_path / "old.json", "--json") == tmp_path / "old.json"
    assert check_output_file(tmp_path / "new" / "deeper" / "x.json", "--json").name == "x.json"
    assert check_output_folder(tmp_path / "fresh") == tmp_path / "fresh"

"""`spe report` on two tiny checkpoints (sinespe, ape), its tables and files, and the R-grid grouping."""

import json
import math
import shutil

import pytest

from spe.lab.cli.main import main
from spe.lab.music.evaluation.audio import render_audio
from spe.lab.music.evaluation.music_prompt import bar_start
from spe.lab.music.evaluation.r_grid import r_grids
from spe.lab.metrics.pe_probe import probe_plan, probe_tokens

TINY = ["--seq-len", "32", "--batch-size", "2", "--d-model", "32", "--num-layers", "1", "--num-heads", "2",
        "--num-realizations", "4", "--eval-every", "2", "--threads", "1", "--steps", "2", "--no-progress"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from conftest import write_midi

    root = tmp_path_factory.mktemp("report")
    # 40 pieces: the 5 % validation split then holds 2 pieces, so the ± over sequences exists.
    for i in range(40):
        write_midi(root / "midi" / f"piece{i}.mid", seed=i, notes=70 + i % 5 * 10)
    cache = str(root / "cache")
    checkpoints = []
    for positional in ("sinespe", "ape"):
        run = root / positional
        flags = TINY if positional == "sinespe" else [f for f in TINY if f not in ("--num-realizations", "4")]
        assert main(["train", "--data", str(root / "midi"), "--cache-dir", cache, "--out", str(run),
                     "--positional", positional, *flags]) == 0
        checkpoints.append(str(run))
    return root, checkpoints


def _is_png(path):
    data = path.read_bytes()
    return len(data) > 8 and data[:8] == PNG_SIGNATURE


@pytest.mark.slow
def test_report_on_two_checkpoints(runs, monkeypatch, capsys):
    root, (spe_run, ape_run) = runs
    out = root / "out"
    monkeypatch.setattr(shutil, "which", lambda name: None)
    import spe.checkpoint
    import spe.lab.music.corpus

    calls = {"weights": 0, "corpus": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(spe.checkpoint, "_load_model", counting("weights", spe.checkpoint._load_model))
    monkeypatch.setattr(spe.lab.music.corpus, "load_corpus", counting("corpus", spe.lab.music.corpus.load_corpus))
    assert main(["report", "--checkpoint", spe_run, "--checkpoint", ape_run, "--out", str(out), "--length", "24",
                 "--probe-tokens", "3", "--r-test", "2,8", "--no-progress"]) == 0
    assert str(out / "report.md") in capsys.readouterr().out
    # every checkpoint is read once, the corpus is split once, for all six sections and both R values
    assert calls == {"weights": 2, "corpus": 1}
    text = (out / "report.md").read_text()
    report = json.loads((out / "report.json").read_text())

    # Extrapolation table: both models, mean ± std over the 2 validation sequences, default 2 × 32 positions.
    section = text.split("## 1.")[1].split("## 2.")[0]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| ")}
    assert {"sinespe", "ape", "unigram (all 64 positions)"} <= set(rows)
    assert "Evaluated positions: 64 (2 × the training length of 32;" in text
    assert "±" in rows["sinespe"] and "±" in rows["ape"]
    assert report["max_length"] == 64 and report["extrapolation"]["num_sequences"] == 2
    for m in report["extrapolation"]["models"]:
        assert m["within_std"] > 0 and math.isfinite(m["beyond"])

    # PE metrics: T and M tables with a value per model and per (range, offset) of the probe plan.
    section = text.split("## 2.")[1].split("## 3.")[0]
    assert "Translation invariance T" in section and "Monotonicity M" in section
    assert "q ∈ [0, 32), o < 32" in section and "q ∈ [32, 64), o < 32" in section
    for name in ("sinespe", "ape"):
        res = report["pe_metrics"][name]
        assert res["length"] == 64 and res["tokens"] == probe_tokens(res["tokens"][-1] + 1, 3)
        for column in res["columns"]:
            for metric in ("T", "M"):
                assert 0 <= column[metric]["best"] == min(column[metric]["per_head"]) <= 1

    # Generation and style similarity: one row per model, four parts per profile.
    section = text.split("## 5.")[1].split("## 6.")[0]
    style_rows = [line for line in section.splitlines() if line.startswith(("| sinespe", "| ape"))]
    assert len(style_rows) == 2 and all(line.count(" / ") == 6 for line in style_rows)
    assert "Audio: skipped: `fluidsynth` is not on PATH" in section
    assert all(len(s["onset_duration"]) == len(s["time_pitch"]) == 4 for s in report["generation"]["style"])

    # R ablation: only the SPE model, trained R = 4, tested at 2 and 8.
    grid, = report["r_grid"]["grids"]
    assert (grid["trained"], grid["test"]) == ([4], [2, 8])
    assert all(math.isfinite(v) for v in grid["within"][0])

    pngs = ["extrapolation/extrapolation.png", "figures/kernels-sinespe.png", "figures/attention-sinespe.png",
            "figures/attention-ape.png", "figures/piano-roll-sinespe.png", "figures/piano-roll-ape.png",
            "figures/style-similarity.png", grid["figure"]]
    for png in pngs:
        assert _is_png(out / png), png
        assert f"]({png})" in text  # linked with a path relative to report.md
    assert not (out / "figures" / "kernels-ape.png").exists()
    for midi in ("prompt", "sinespe", "ape"):
        assert (out / "generated" / f"{midi}.mid").stat().st_size > 0
    # The prompt is decoded with the corpus's own token numbering: the 4/4 of the source MIDI stays 4/4.
    from symusic import Score

    prompt = Score(str(out / "generated" / "prompt.mid"))
    assert [(ts.numerator, ts.denominator) for ts in prompt.time_signatures] == [(4, 4)]
    assert prompt.end() <= 2 * 4 * prompt.tpq  # two bars


def test_bar_start_follows_time_signatures():
    from symusic import Score, TimeSignature

    score = Score(8)
    assert bar_start(score, 2) == 2 * 32  # no signature: 4/4, 4 beats of 8 ticks
    score.time_signatures.append(TimeSignature(0, 3, 4))
    score.time_signatures.append(TimeSignature(48, 6, 8))
    assert [bar_start(score, b) for b in range(4)] == [0, 24, 48, 72]  # 3/4: 24 ticks, 6/8: 24 ticks
    score.time_signatures[1] = TimeSignature(48, 2, 2)
    assert bar_start(score, 4) == 48 + 2 * 32


@pytest.mark.parametrize("argv,message", [
    (["--r-test", "0,8"], "--r-test"), (["--probe-tokens", "0"], "--probe-tokens"),
    (["--length", "0"], "--length")])
def test_report_usage_errors_are_one_line(tmp_path, capsys, argv, message):
    assert main(["report", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_r_grids_group_by_trained_r():
    records = [{"family": "sinespe/performer", "trained": rt, "test": rs, "within": rt + rs / 100, "beyond": 2.0}
               for rt in (16, 4) for rs in (32, 8)]
    records.append({"family": "sinespe/performer", "trained": 4, "test": 8, "within": 5.08, "beyond": 4.0})
    records.append({"family": "convspe/performer", "trained": 4, "test": 8, "within": 1.0, "beyond": 1.0})
    sine, conv = r_grids(records)
    assert (sine["trained"], sine["test"]) == ([4, 16], [8, 32])
    assert [len(row) for row in sine["within"]] == [2, 2] and [len(row) for row in sine["beyond"]] == [2, 2]
    assert sine["within"][0][0] == pytest.approx((4.08 + 5.08) / 2)  # two checkpoints with R 4 averaged
    assert sine["beyond"][0][0] == pytest.approx(3.0) and sine["count"] == [[2, 1], [1, 1]]
    assert sine["within"][1][1] == pytest.approx(16.32)
    assert (conv["trained"], conv["test"], conv["within"]) == ([4], [8], [[1.0]])
    with pytest.raises(ValueError, match="lacks"):
        r_grids([{"family": "x", "trained": 4}])


def test_probe_plan_scales_table_7():
    assert probe_plan(2048) == {"length": 2560, "ranges": [(0, 2048), (2048, 2560)], "offsets": [63, 511]}
    assert probe_plan(32) == {"length": 64, "ranges": [(0, 32), (32, 64)], "offsets": [31]}
    assert probe_tokens(300, 4) == [0, 100, 199, 299] and probe_tokens(3, 10) == [0, 1, 2]
    with pytest.raises(ValueError, match="at least 2"):
        probe_plan(1)


def test_audio_is_rendered_with_fluidsynth_and_a_soundfont(tmp_path, monkeypatch):
    # A stand-in fluidsynth writes its -F argument; a second one fails like a broken install.
    fake = tmp_path / "fluidsynth"
    fake.write_text('#!/bin/sh\nwhile [ "$1" != "-F" ]; do shift; done\nprintf RIFF > "$2"\n')
    fake.chmod(0o755)
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'fluidsynth: error: bad soundfont' >&2\nexit 1\n")
    broken.chmod(0o755)
    midi = tmp_path / "piece.mid"
    midi.write_bytes(b"MThd")
    monkeypatch.setenv("SPE_SOUNDFONT", str(tmp_path / "missing.sf2"))
    monkeypatch.setattr(shutil, "which", lambda name: str(fake))
    wavs, note = render_audio([midi])
    assert wavs == [None] and note.startswith("skipped") and "missing.sf2" in note
    (tmp_path / "gm.sf2").write_bytes(b"sf2")
    monkeypatch.setenv("SPE_SOUNDFONT", str(tmp_path / "gm.sf2"))
    wavs, note = render_audio([midi])
    assert wavs == [tmp_path / "piece.wav"] and wavs[0].read_bytes() == b"RIFF" and "gm.sf2" in note
    monkeypatch.setattr(shutil, "which", lambda name: str(broken))
    wavs, note = render_audio([tmp_path / "other.mid"])
    assert wavs == [None] and "failed for other.mid: fluidsynth: error: bad soundfont" in note
    assert not list(tmp_path.glob(".other.wav*"))  # no temporary file left behind


def test_publish_report_copies_images_and_drops_music_links(tmp_path):
    from spe.lab.music.evaluation.publish import publish_report

    src = tmp_path / "report"
    (src / "figures").mkdir(parents=True)
    (src / "figures" / "a.png").write_bytes(b"\x89PNG\r\n\x1a\nxyz")
    (src / "report.md").write_text("# R\n\n![A plot](figures/a.png)\n\n[generated/x.mid](generated/x.mid)\n")
    doc = publish_report(src, tmp_path / "docs" / "results.md", preamble="How.\n\n")
    text = doc.read_text()
    assert text.startswith("How.") and "![A plot](results/figures-a.png)" in text
    assert (tmp_path / "docs" / "results" / "figures-a.png").read_bytes().startswith(b"\x89PNG")
    assert "(generated/x.mid)" not in text and "not committed" in text
    with pytest.raises(ValueError, match="no report.md"):
        publish_report(tmp_path / "missing", tmp_path / "x.md")


def test_model_names_are_the_shortest_unique_run_paths():
    from spe.lab.music.evaluation.report import run_names

    assert run_names(["runs/ablation/ape/seed0", "runs/ablation/sinespe/seed0"]) == ["ape", "sinespe"]
    assert run_names(["runs/a", "runs/b"]) == ["a", "b"]
    assert run_names(["x/a/run", "y/a/run"]) == ["x-a", "y-a"]
    assert run_names(["runs/a", "runs/a"]) == ["a", "a-2"]

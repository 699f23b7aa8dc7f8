"""spe app's work without a browser: opening runs and exports, prompts, generation, the piano roll,
the audio, the run's evaluation, and the messages of bad input."""

import sys
from pathlib import Path

import pytest
from symusic import Note, Score, Track

from spe.lab.app import core
from spe.lab.app.page import SOURCES, _generate, _Models
from spe.lab.cli.main import main


def test_runs_and_exports_are_found_but_not_intermediate_checkpoints(music_run, exported, tmp_path):
    assert core.find_models(music_run.parent) == sorted([music_run, exported])
    assert core.open_model(music_run).kind == "run" and core.open_model(exported).kind == "export"
    model = (music_run / "model.safetensors").read_bytes()
    for folder in ("run", "run/checkpoints/step-1", ".hidden/run", "lra"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "model.safetensors").write_bytes(model if folder != "lra" else b"not a checkpoint")
    assert core.find_models(tmp_path) == [tmp_path / "run"]


def test_a_path_that_is_no_music_model_is_one_message(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        core.open_model(tmp_path / "nowhere")
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text('{"model_type": "spe"}')
    with pytest.raises(ValueError, match="without tokenizer.json"):
        core.open_model(tmp_path / "export")


@pytest.mark.parametrize("which", ["run", "export"])
def test_a_prompt_file_is_continued_reproducibly_and_drawn(music_run, exported, prompt, tmp_path, generation, which):
    app = core.open_model(music_run if which == "run" else exported)
    ids, note = core.upload_prompt(app, prompt, 2)
    assert ids and note == ""
    first = core.generate_piece(app, ids, tmp_path, **generation)
    again = core.generate_piece(app, ids, tmp_path, **generation)
    assert first.ids == again.ids and first.ids[:len(ids)] == ids and len(first.ids) == len(ids) + 64
    assert first.midi != again.midi  # a new file for each generation
    assert sum(len(t.notes) for t in Score(str(first.midi)).tracks) == first.notes > 0
    assert first.prompt_end > 0
    png = core.piano_roll(first, tmp_path / "roll.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_corpus_piece_gives_its_first_bars(music_run):
    app = core.open_model(music_run)
    ids, note = core.corpus_prompt(app, 0, 1)
    assert ids.count(app.tokenizer.vocab["Bar_None"]) == 1 and "corpus piece 0 of" in note
    for index in (99, -1, None, float("inf")):
        with pytest.raises(ValueError, match=f"corpus piece {index} does not exist"):
            core.corpus_prompt(app, index, 1)


@pytest.mark.parametrize("content, match", [(b"", "is empty"), (b"not a midi file", "cannot read prompt MIDI"),
                                            (None, "over the page's limit")])
def test_a_bad_prompt_file_is_a_message_naming_it(music_run, tmp_path, content, match):
    bad = tmp_path / "bad.mid"
    if content is None:  # a sparse file past the limit: nothing is read
        with bad.open("wb") as f:
            f.truncate(core.MAX_PROMPT_BYTES + 1)
    else:
        bad.write_bytes(content)
    with pytest.raises(ValueError, match=match) as err:
        core.upload_prompt(core.open_model(music_run), bad, 2)
    assert "bad.mid" in str(err.value)


@pytest.mark.parametrize("change, match", [({"length": 0}, "length must be"), ({"length": 10**6}, "length must be"),
                                           ({"top_p": 0.0}, "top-p"), ({"temperature": -1.0}, "temperature"),
                                           ({"seed": -1}, "seed must be"), ({"seed": 1.5}, "seed must be"),
                                           ({"seed": None}, "seed must be"), ({"length": float("nan")}, "length")])
def test_bad_settings_are_refused_before_generating(music_run, tmp_path, generation, change, match):
    with pytest.raises(ValueError, match=match):
        core.generate_piece(core.open_model(music_run), [], tmp_path / "out", **{**generation, **change})
    assert not (tmp_path / "out").exists()


def _score(tmp_path, *tracks) -> Path:
    score = Score(480)
    for program, pitch in tracks:
        track = Track(program=program)
        track.notes.extend(Note(i * 480, 480, pitch, 90) for i in range(4))
        score.tracks.append(track)
    score.dump_midi(str(tmp_path / "score.mid"))
    return tmp_path / "score.mid"


def test_without_spe_soundfont_or_a_system_one_pretty_midis_is_used(monkeypatch, soundfont, tmp_path):
    from spe.lab.music.evaluation import audio

    monkeypatch.delenv("SPE_SOUNDFONT")
    monkeypatch.setattr(audio, "SOUNDFONTS", (str(tmp_path / "system.sf2"),))
    assert core.find_soundfont() == (Path(soundfont), "")
    (tmp_path / "system.sf2").write_bytes(b"RIFF")
    assert core.find_soundfont() == (tmp_path / "system.sf2", "")


def test_the_audio_is_rendered_with_the_soundfont_found(tmp_path, wav_peak, soundfont):
    assert core.find_soundfont() == (Path(soundfont), "")
    wav, left_out = core.render_wav(_score(tmp_path, (0, 60)), tmp_path / "a.wav", soundfont)
    assert left_out == [] and wav_peak(wav.read_bytes()) > 1000


# A stand-in for the rendering child: announces tracks 0 and 1 and hangs on 1 unless told to skip it.
_HANGS_ON_TRACK_1 = """
import sys, time, shutil
soundfont, midi, wav, rate, skip = sys.argv[1:6]
print(0, flush=True)
if "1" not in skip.split(","):
    print(1, flush=True)
    time.sleep(60)
shutil.copy(soundfont, wav)
"""


def test_a_track_the_synthesizer_hangs_on_is_left_out(tmp_path, monkeypatch):
    monkeypatch.setattr(core, "_RENDER", _HANGS_ON_TRACK_1)
    (tmp_path / "fake.sf2").write_bytes(b"RIFF")
    wav, left_out = core.render_wav(_score(tmp_path, (0, 60), (21, 101)), tmp_path / "a.wav", tmp_path / "fake.sf2",
                                    timeout=2)
    assert left_out == ["program 21"] and wav.read_bytes() == b"RIFF"


def test_without_a_soundfont_the_page_says_so_and_still_draws(music_run, prompt, tmp_path, monkeypatch, generation):
    monkeypatch.setenv("SPE_SOUNDFONT", str(tmp_path / "missing.sf2"))
    roll, audio, midi, message = _generate(_Models([music_run]), tmp_path, str(music_run), SOURCES[1], str(prompt),
                                           0, 2, *generation.values())
    assert audio is None and "No audio: SPE_SOUNDFONT" in message and "missing.sf2" in message
    assert Path(roll).is_file() and Path(midi).is_file()


def test_bad_input_on_the_page_is_a_message_not_a_traceback(music_run, tmp_path, generation):
    (tmp_path / "notes.mid").write_text("not music")
    models = _Models([music_run])
    for source, upload in ((SOURCES[1], str(tmp_path / "notes.mid")), (SOURCES[1], None)):
        assert _generate(models, tmp_path, str(music_run), source, upload, 0, 2, *generation.values())[:3] == (
            None, None, None)
    message = _generate(models, tmp_path, str(music_run), SOURCES[1], str(tmp_path / "notes.mid"), 0, 2,
                        *generation.values())[3]
    assert message.startswith("**Error:**") and "notes.mid" in message and "Traceback" not in message
    assert "not one of the models" in _generate(models, tmp_path, "elsewhere", SOURCES[0], None, 0, 2,
                                                *generation.values())[3]


def test_the_runs_evaluation_beside_it_is_shown(music_run, tmp_path):
    png, numbers = core.run_results(music_run)
    assert png == music_run.parent / "run-evaluation" / "extrapolation.png" and png.is_file()
    assert "within training length" in numbers and "step 2" in numbers
    png, hint = core.run_results(tmp_path)
    assert png is None and "spe evaluate" in hint


@pytest.mark.parametrize("argv, match", [(["--run", "nowhere"], "nowhere"), (["--port", "0"], "--port"),
                                         ([], "no music run")])
def test_spe_app_refuses_bad_flags_in_one_line(tmp_path, monkeypatch, capsys, argv, match):
    monkeypatch.chdir(tmp_path)
    assert main(["app", *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv, host", [([], "127.0.0.1"), (["--host", "0.0.0.0"], "0.0.0.0")])
def test_the_page_listens_on_this_machine_only_unless_told(music_run, monkeypatch, argv, host):
    import gradio

    launched = {}
    monkeypatch.setattr(gradio.Blocks, "launch", lambda self, **keywords: launched.update(keywords))
    assert main(["app", "--run", str(music_run), "--port", "7999", *argv]) == 0
    assert launched["server_name"] == host and launched["server_port"] == 7999 and launched["share"] is False


def test_without_gradio_spe_app_says_which_extra_to_install(music_run, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gradio", None)  # import gradio then fails as when it is not installed
    assert main(["app", "--run", str(music_run)]) == 2
    err = capsys.readouterr().err
    assert "gradio" in err and "spe[app]" in err and len(err.strip().splitlines()) == 1

"""MIDI prompts: only their first bars are tokenised, drums are left out, and a prompt without a usable
note is an error naming the file and why; checkpoints with NaN weights are refused (spe generate, evaluate)."""

import re
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from symusic import Note, Score, TimeSignature, Track

import spe
from spe.lab.cli.main import main
from spe.lab.music.corpus import make_tokenizer, tokenizer_to_json
from spe.lab.music.generation import prompt_ids
from spe.models import ModelConfig
from spe.models.decoder_lm import DecoderLM


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


def _write(path, notes, *, drum=False, tracks=1, time_signatures=(), tpq=480):
    """A MIDI file of (onset in ticks, duration, pitch) notes on ``tracks`` equal tracks."""
    score = Score(tpq)
    for time, numerator, denominator in time_signatures:
        score.time_signatures.append(TimeSignature(time, numerator, denominator))
    for _ in range(tracks):
        track = Track(program=0, is_drum=drum)
        for onset, duration, pitch in notes:
            track.notes.append(Note(onset, duration, pitch, 80))
        score.tracks.append(track)
    score.dump_midi(str(path))
    return path


def _cut(tokenizer, ids, bars):
    """What prompt_ids did to the ids of the whole file: cut before bar ``bars``."""
    starts = [i for i, t in enumerate(ids) if t == tokenizer.vocab["Bar_None"]]
    return ids[:starts[bars]] if len(starts) > bars else ids


def test_only_the_first_bars_are_tokenised_and_the_ids_are_those_of_the_whole_file(tokenizer, tmp_path):
    # time signatures of 4/4, 6/8, 12/8 and 3/4, notes far apart (an 80-quarter rest), long ones
    notes = [(i * 240, 240 * (1 + i % 5), 40 + i % 40) for i in range(60)]
    notes += [(240 * 60 + 80 * 480 + i * 120, 120, 60 + i % 12) for i in range(5_000)]
    path = _write(tmp_path / "long.mid", notes, time_signatures=[(0, 4, 4), (1920, 6, 8), (4800, 12, 8),
                                                                 (9600, 3, 4)])
    encoded = []

    class Spy:  # the tokenizer, recording how many notes each encoded score holds
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def encode(self, score):
            encoded.append(score.note_num())
            return tokenizer.encode(score)

    whole = list(tokenizer.encode(Score(str(path))).ids)
    for bars in (1, 2, 3, 5, 8, 12, 40):
        assert prompt_ids(Spy(), path, bars) == _cut(tokenizer, whole, bars), bars
    assert max(encoded) < 1_000  # of 5,060: the file was clipped before tokenising


@pytest.mark.parametrize(("notes", "options", "message"), [
    ([], {"tracks": 0}, r"^prompt \S+ holds no notes$"),
    ([], {}, r"^prompt \S+ holds no notes$"),
    ([(i * 480, 240, 36 + i % 3) for i in range(12)], {"drum": True},
     r"^prompt \S+ .*drum notes only \(12 notes\).*pitched notes"),
    ([(i * 480, 240, 5 + i) for i in range(12)], {},
     r"^prompt \S+: .*pitch range 21–108 .*12 notes, pitches 5–16"),
    ([(i * 480, 240, 110) for i in range(8)] + [(20 * 480, 240, 60)], {},
     r"^prompt \S+: .*first 2 bars \(--prompt-bars 2\).*21–108.*quarter note 20$"),
    ([(40 * 480 + i * 480, 240, 60) for i in range(8)], {},
     r"^prompt \S+: .*first 2 bars \(--prompt-bars 2\).*21–108.*quarter note 40$"),
], ids=["no tracks", "no notes", "drums only", "pitches below the range", "first bars above the range",
        "first bars empty"])
def test_a_prompt_without_a_usable_note_is_an_error_naming_why(tokenizer, tmp_path, notes, options, message):
    path = _write(tmp_path / "p.mid", notes, **options)
    with pytest.raises(ValueError, match=message):
        prompt_ids(tokenizer, path, 2)
    assert prompt_ids(tokenizer, path, 0) == []  # zero bars asked for: no prompt, nothing to refuse


def test_drum_tracks_are_left_out_of_a_prompt_with_a_warning(tokenizer, tmp_path):
    melody = [(i * 480, 240, 60 + i % 12) for i in range(16)]
    score = Score(str(_write(tmp_path / "melody.mid", melody)))
    drums = Track(program=0, is_drum=True)
    for i in range(16):
        drums.notes.append(Note(i * 480, 120, 36, 80))
    score.tracks.append(drums)
    score.dump_midi(str(tmp_path / "band.mid"))
    with pytest.warns(UserWarning, match=r"^prompt \S+band\.mid: .*16 drum notes.*1 drum track"):
        ids = prompt_ids(tokenizer, tmp_path / "band.mid", 2)
    assert ids == prompt_ids(tokenizer, tmp_path / "melody.mid", 2)
    assert not any(tokenizer[i].startswith("PitchDrum") for i in ids)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tokenizer):
    """A music checkpoint (untrained, with its tokenizer) and a copy whose weights hold NaN."""
    root = tmp_path_factory.mktemp("generate")
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(vocab_size=len(tokenizer.vocab), d_model=16, num_layers=1, num_heads=2, d_ff=32,
                                  num_features=8, num_realizations=4))
    good = spe.save(model, root / "run", metadata={"tokenizer": tokenizer_to_json(tokenizer),
                                                   "train": {"seq_len": 32}})
    with safe_open(str(good), framework="pt") as f:
        header = dict(f.metadata())
    state = load_file(str(good))
    state["blocks.0.attn.qkv.weight"][0, :3] = float("nan")
    (root / "nan").mkdir()
    save_file(state, str(root / "nan" / "model.safetensors"), metadata=header)
    return root


@pytest.mark.parametrize(("argv", "message"), [
    (["generate", "--checkpoint", "{root}/nan", "--length", "4", "--out", "{root}/x.mid"],
     r"nan/model\.safetensors: tensor blocks\.0\.attn\.qkv\.weight holds 3 non-finite values \(NaN/inf\) of 768: "
     r"the checkpoint is unusable$"),
    (["evaluate", "--checkpoint", "{root}/nan", "--out", "{root}/eval"],
     r"nan/model\.safetensors: tensor blocks\.0\.attn\.qkv\.weight holds 3 non-finite values"),
    (["generate", "--checkpoint", "{root}/run", "--prompt", "{root}/drums.mid", "--length", "4", "--out",
      "{root}/x.mid"], r"drums\.mid holds drum notes only \(4 notes\)"),
], ids=["generate NaN weights", "evaluate NaN weights", "generate drums-only prompt"])
def test_the_cli_gives_one_line_and_exit_2(checkpoints, argv, message, capsys):
    root = checkpoints
    _write(root / "drums.mid", [(i * 480, 240, 36) for i in range(4)], drum=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([a.format(root=root) for a in argv] + ["--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"spe {argv[0]}: error: "), err
    assert re.search(message, err[0]), err[0]
    assert not (root / "x.mid").exists()

"""The tokenizer keeps what the score says: tempo, time signatures and tracks that share a
program, by default (flags turn each off), a run from before these options keeps its own
tokenizer, caches are keyed on the options, the grammar mask and the onset clock read the new
vocabulary, and the summary line says what is kept and dropped."""

import json
import logging

import pytest
import torch
from conftest import write_midi

from spe.lab.music.grammar import REMIGrammar
from spe.lab.music.corpus import (TokenizerOptions, legacy_tokenizer_json, load_corpus, make_tokenizer,
                                recorded_tokenizer, tokenizer_from_json, tokenizer_options, tokenizer_summary,
                                tokenizer_to_json)


def _score(qpm: float, numerator: int, denominator: int, programs=(40, 40)):
    """Eight bars of quarter notes at ``qpm`` in ``numerator/denominator``, one track per program."""
    from symusic import Note, Score, Tempo, TimeSignature, Track

    score, tpq = Score(480), 480
    score.tempos.append(Tempo(0, qpm=qpm))
    score.time_signatures.append(TimeSignature(0, numerator, denominator))
    beats = 8 * numerator * 4 // denominator
    for k, program in enumerate(programs):
        track = Track(program=program, name=f"voice {k}")
        for i in range(beats):
            track.notes.append(Note(i * tpq, tpq, 60 + 7 * k + i % 5, 80))
        score.tracks.append(track)
    return score


def _round_trip(tokenizer, score):
    return tokenizer.decode(tokenizer.encode(score))


def _notes(score) -> list[list[tuple[int, int, float, float]]]:
    """Each track's notes as (program, pitch, onset, duration) in quarter notes, tracks sorted."""
    return sorted([(t.program, n.pitch, n.time / score.tpq, n.duration / score.tpq) for n in t.notes]
                  for t in score.tracks)


@pytest.mark.parametrize(("numerator", "denominator"), [(3, 2), (4, 2), (2, 2), (6, 8), (3, 4)])
def test_a_prompt_keeps_its_tempo_time_signature_and_tracks_through_tokens(numerator, denominator):
    score = _score(90, numerator, denominator)  # two tracks of program 40 (two violins)
    back = _round_trip(make_tokenizer(), score)
    assert [round(t.qpm, 3) for t in back.tempos] == [90.0]
    assert [(t.numerator, t.denominator) for t in back.time_signatures] == [(numerator, denominator)]
    assert len(back.tracks) == 2 and _notes(back) == _notes(score)


def test_tracks_of_several_programs_keep_their_own_voices():
    score = _score(120, 4, 4, programs=(0, 40, 0, 40, 0))
    tokenizer = make_tokenizer()
    ids = tokenizer.encode(score)
    assert {t for t in ids.tokens if t.startswith("Track_")} == {"Track_1", "Track_2"}
    assert _notes(tokenizer.decode(ids)) == _notes(score)
    single = tokenizer.encode(_score(120, 4, 4, programs=(0, 40)))  # one track a program: no Track token
    assert not any(t.startswith("Track_") for t in single.tokens)


def test_without_the_options_tempo_is_120_bars_are_4_4_and_tracks_merge():
    plain = make_tokenizer(TokenizerOptions(tempos=False, time_signatures=False, merge_tracks=True))
    back = _round_trip(plain, _score(90, 3, 2))
    assert [round(t.qpm) for t in back.tempos] == [120]
    assert [(t.numerator, t.denominator) for t in back.time_signatures] == [(4, 4)]
    assert len(back.tracks) == 1 and len(back.tracks[0].notes) == 2 * len(_score(90, 3, 2).tracks[0].notes)


def test_a_run_from_before_the_options_keeps_miditok_s_default_tokenizer():
    from miditok import REMI, TokenizerConfig

    before = REMI(TokenizerConfig(use_programs=True, one_token_stream_for_programs=True))  # what every run used
    legacy = legacy_tokenizer_json()
    assert legacy == tokenizer_to_json(before)
    assert tokenizer_from_json(legacy).vocab == before.vocab
    # checkpoints that stored it with sorted keys: MidiTok would renumber its TimeSig tokens
    sorted_keys = json.dumps(before.to_dict(), sort_keys=True, default=str)
    assert tokenizer_from_json(sorted_keys).vocab == before.vocab
    assert recorded_tokenizer({"data": "x", "seq_len": 256}) == legacy  # recorded no option: its tokenizer
    assert recorded_tokenizer({"tempos": False, "time_signatures": True}) == TokenizerOptions(tempos=False)
    assert tokenizer_options(legacy) == TokenizerOptions(tempos=False, time_signatures=True, merge_tracks=True,
                                                         legacy_tokenizer=True)
    # a stored tokenizer wins: 4/2 stays 4/4 for such a run, as it did
    back = _round_trip(tokenizer_from_json(legacy), _score(90, 4, 2))
    assert [(t.numerator, t.denominator) for t in back.time_signatures] == [(4, 4)]


def test_the_evaluated_split_of_an_old_run_is_tokenised_as_it_was(tmp_path):
    from miditok import REMI, TokenizerConfig
    from symusic import Score

    from spe.lab.music.split import split_of_run

    for i in range(3):
        write_midi(tmp_path / "midi" / f"p{i}.mid", seed=i)
    old_run = {"data": str(tmp_path / "midi"), "cache_dir": str(tmp_path / "cache")}
    split = split_of_run(old_run, split="all")
    before = REMI(TokenizerConfig(use_programs=True, one_token_stream_for_programs=True))
    assert split.tokenizer_json == tokenizer_to_json(before)
    expected = [before.encode(Score(str(tmp_path / "midi" / f"p{i}.mid"))).ids for i in range(3)]
    assert [p.tolist() for p in split.val_pieces] == expected


def test_the_token_cache_is_keyed_on_the_tokenizer_options(tmp_path):
    for i in range(2):
        write_midi(tmp_path / "midi" / f"p{i}.mid", seed=i)
    cache = tmp_path / "cache"
    kept = load_corpus(tmp_path / "midi", cache_dir=cache, progress=False)
    plain = load_corpus(tmp_path / "midi", cache_dir=cache, progress=False,
                        tokenizer=TokenizerOptions(tempos=False, time_signatures=False))
    merged = load_corpus(tmp_path / "midi", cache_dir=cache, progress=False,
                         tokenizer=TokenizerOptions(merge_tracks=True))
    assert len(list((cache / "tokens").glob("*.npz"))) == 3 and merged.tokenizer_json != kept.tokenizer_json
    assert kept.tokenizer_json != plain.tokenizer_json
    assert len(kept.pieces[0]) > len(plain.pieces[0])  # the Tempo and TimeSig tokens
    again = load_corpus(tmp_path / "midi", cache_dir=cache, progress=False)  # from its own cache
    assert [p.tolist() for p in again.pieces] == [p.tolist() for p in kept.pieces]


@pytest.mark.parametrize(("numerator", "denominator"), [(3, 2), (4, 2), (12, 8), (4, 4)])
def test_the_grammar_mask_accepts_every_token_of_scores_in_the_new_vocabulary(numerator, denominator):
    tokenizer = make_tokenizer()
    ids = tokenizer.encode(_score(96, numerator, denominator, programs=(0, 40, 0))).ids
    grammar = REMIGrammar(tokenizer)
    refused = [i for i in range(len(ids)) if not grammar.allowed_next(ids[:i])[ids[i]]]
    assert refused == []
    assert tokenizer.tokens_errors(ids) == 0  # MidiTok's own check


@pytest.mark.parametrize(("numerator", "denominator"), [(3, 2), (4, 2), (2, 1)])
def test_the_onset_clock_reads_half_note_time_signatures_and_track_tokens(numerator, denominator):
    from spe.encodings.onset import remi_onsets

    tokenizer = make_tokenizer()
    score = _score(90, numerator, denominator, programs=(0, 0))
    seq = tokenizer.encode(score)
    onsets = remi_onsets(torch.tensor([seq.ids]), tokenizer.vocab)[0]
    got = sorted(float(onsets[i]) for i, token in enumerate(seq.tokens) if token.startswith("Pitch_"))
    assert got == sorted(n.time / score.tpq for t in score.tracks for n in t.notes)


def test_the_summary_says_what_is_kept_and_dropped():
    kept = tokenizer_summary(make_tokenizer())
    assert "keeps" in kept and "tempo (40-250 qpm" in kept and "3/2" in kept and "4/2" in kept
    assert "tracks that share a program apart" in kept
    plain = tokenizer_summary(make_tokenizer(TokenizerOptions(tempos=False, time_signatures=False,
                                                              merge_tracks=True)))
    assert "drops" in plain and "tempo (every piece decodes at 120 qpm)" in plain
    assert "time signatures (every bar is 4/4)" in plain and "tracks that share a program (merged" in plain


def test_training_uses_the_flags_logs_the_summary_and_a_resumed_old_run_keeps_its_tokenizer(tmp_path, caplog):
    from tiny_run import tiny_config

    from spe.lab.cli.main import _train_config, build_parser
    from spe.lab.music.task import LMTask

    args = build_parser().parse_args(["train", "--no-tempos", "--time-signatures", "--merge-tracks",
                                      "--out", str(tmp_path / "r")])
    cfg = _train_config(args)
    assert (cfg.tempos, cfg.time_signatures, cfg.merge_tracks) == (False, True, True)

    task = LMTask(tiny_config(tmp_path, "run", tempos=False), progress=False)
    with caplog.at_level(logging.INFO):
        task._load_data(progress=False)
    assert tokenizer_options(task.split.tokenizer_json) == TokenizerOptions(tempos=False)
    assert any("tokenizer (REMI): keeps" in r.getMessage() and "tempo (every piece" in r.getMessage()
               for r in caplog.records)

    old = LMTask(tiny_config(tmp_path, "old"), progress=False)  # defaults now: tempo and signatures kept
    old._keep_recorded_tokenizer({"tokenizer": legacy_tokenizer_json(), "train": {"seq_len": 32}})
    old._load_data(progress=False)
    assert old.split.tokenizer_json == legacy_tokenizer_json()
    assert old.vocab_size == len(tokenizer_from_json(legacy_tokenizer_json())) < task.vocab_size + 1
    # recorded as its tokenizer has them
    assert (old.cfg.tempos, old.cfg.time_signatures, old.cfg.merge_tracks) == (False, True, True)


def test_runs_with_other_tokenizers_are_not_evaluated_together(tmp_path):
    from spe.checkpoint import LoadedCheckpoint
    from spe.lab.music.evaluation.checkpoints import evaluate_checkpoints
    from spe.models import ModelConfig
    from spe.models.decoder_lm import DecoderLM

    def run(name, tokenizer_json):
        model = DecoderLM(ModelConfig(vocab_size=700, d_model=16, num_layers=1, num_heads=2, d_ff=32, num_features=8))
        return LoadedCheckpoint(path=f"runs/{name}", model=model,
                                metadata={"train": {"seq_len": 32}, "tokenizer": tokenizer_json})

    old, new = run("old", legacy_tokenizer_json()), run("new", tokenizer_to_json(make_tokenizer()))
    with pytest.raises(ValueError, match="runs/new.*tokenizer.*runs/old"):
        evaluate_checkpoints([old, new], tmp_path / "eval", max_length=64, data=None, cache_dir=None, batch_size=2,
                             device="cpu", json_path=None, progress=False)
    assert not (tmp_path / "eval" / "summary.json").exists()


def test_a_generated_piece_keeps_its_prompt_s_tempo_signature_and_tracks(tmp_path):
    from symusic import Score

    from spe.checkpoint import LoadedCheckpoint
    from spe.lab.music.generation import generate_midi
    from spe.models import ModelConfig
    from spe.models.decoder_lm import DecoderLM

    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(vocab_size=len(tokenizer), d_model=16, num_layers=1, num_heads=2, d_ff=32,
                                  num_features=8, num_realizations=4))
    run = LoadedCheckpoint(path="runs/tiny", model=model,
                           metadata={"train": {"seq_len": 256}, "tokenizer": tokenizer_to_json(tokenizer)})
    _score(90, 3, 2).dump_midi(str(tmp_path / "prompt.mid"))  # two violins at 90 qpm in 3/2
    generate_midi(run, str(tmp_path / "out.mid"), length=16, prompt=str(tmp_path / "prompt.mid"), prompt_bars=2,
                  seed=0, top_p=0.9, temperature=1.0)
    out = Score(str(tmp_path / "out.mid"))
    assert round(out.tempos[0].qpm, 3) == 90.0
    assert (out.time_signatures[0].numerator, out.time_signatures[0].denominator) == (3, 2)
    violins = [t for t in out.tracks if t.program == 40 and not t.is_drum]
    assert len(violins) >= 2 and all(len(t.notes) >= 6 for t in violins[:2])  # two bars of 3/2: 6 notes each


def test_the_legacy_tokenizer_option_trains_and_records_the_tokenizer_of_the_older_studies(tmp_path):
    """The plans of the studies run before the tokenizer options pin legacy_tokenizer, so that they rerun
    with the tokenizer they ran with (no combination of the three options gives it)."""
    from tiny_run import tiny_config

    from spe.lab.cli.main import _train_config, build_parser
    from spe.lab.music.plan import variant_config
    from spe.lab.music.task import LMTask
    from spe.lab.plans import load_plan

    legacy = legacy_tokenizer_json()
    combos = [TokenizerOptions(tempos=a, time_signatures=b, merge_tracks=c)
              for a in (False, True) for b in (False, True) for c in (False, True)]
    assert all(tokenizer_to_json(make_tokenizer(o)) != legacy for o in combos)
    assert tokenizer_to_json(make_tokenizer(TokenizerOptions(legacy_tokenizer=True))) == legacy
    assert tokenizer_options(legacy).legacy_tokenizer and not tokenizer_options(tokenizer_to_json(make_tokenizer())).legacy_tokenizer
    # recorded in a run's options, it wins over the three others when the run's split is read again
    assert tokenizer_to_json(make_tokenizer(recorded_tokenizer({"tempos": True, "legacy_tokenizer": True}))) == legacy
    assert build_parser().parse_args(["train", "--legacy-tokenizer"]).legacy_tokenizer is True
    assert _train_config(build_parser().parse_args(["train", "--legacy-tokenizer", "--out", str(tmp_path / "f")])
                         ).legacy_tokenizer
    task = LMTask(tiny_config(tmp_path, "run", legacy_tokenizer=True), progress=False)
    task._load_data(progress=False)
    assert task.split.tokenizer_json == legacy and task.vocab_size == len(tokenizer_from_json(legacy))
    for name in ("ablation", "peers", "gates", "gates-palestrina", "learned-time", "learned-time-palestrina"):
        plan = load_plan(name, "music")
        assert variant_config(plan, next(iter(plan.rows)), 0, tmp_path).legacy_tokenizer, name
    tutorial = load_plan("tutorial", "music")  # run after the options existed: today's tokenizer
    assert not variant_config(tutorial, "ape", 0, tmp_path).legacy_tokenizer

"""spe export: a run becomes a transformers folder with MidiTok's tokenizer; what it refuses; greedy
decoding through transformers gives spe generate's piece."""

import os
from pathlib import Path

import pytest
import torch
from symusic import Score
from tiny_run import tiny_config
from transformers import AutoModelForCausalLM, LogitsProcessorList

import spe
from spe.hf import SPEForCausalLM
from spe.lab.cli.main import main
from spe.lab.export import EXPORT_FILES


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny music run trained for 2 steps."""
    from spe.lab.music.train import train

    return train(tiny_config(tmp_path_factory.mktemp("export"), "run", steps=2, eval_every=2, warmup_steps=1), progress=False)


def _listing(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


def test_the_export_opens_with_transformers_and_miditok_and_gives_the_runs_logits(run, tmp_path, capsys):
    from miditok import REMI

    before = _listing(run)
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 0
    assert "SPEForCausalLM" in capsys.readouterr().out
    assert _listing(run) == before  # nothing written in the run folder
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(EXPORT_FILES)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    tokenizer = REMI.from_pretrained(tmp_path / "out")
    loaded = spe.load(run)
    tokens = torch.tensor([[tokenizer["Bar_None"], *range(5, 20)]])
    assert torch.equal(model(tokens).logits, loaded.model(tokens))
    # the default tokenizer keeps tracks apart (TrackREMI): MidiTok's REMI has its ids but the Track ones,
    # which the generation config suppresses
    suppressed = model.generation_config.suppress_tokens
    assert len(tokenizer) + len(suppressed) == loaded.config.vocab_size
    ids = model.generate(tokens[:, :1], max_new_tokens=64, do_sample=True, top_p=1.0, temperature=5.0)
    assert ids.shape == (1, 65) and int(ids.max()) < len(tokenizer)
    tokenizer.decode(ids[0].tolist()).dump_midi(tmp_path / "generated.mid")
    assert Score(str(tmp_path / "generated.mid")).ticks_per_quarter > 0


def test_overwrite_replaces_an_earlier_export_only(run, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", str(run), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    assert main(["export", str(run), "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["export", str(run), "--out", str(out), "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "mine"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary folder left


@pytest.mark.parametrize("case", ["not-empty", "inside-run", "run-itself", "no-checkpoint", "not-an-export",
                                  "broken-checkpoint"])
def test_export_refuses_in_one_line_and_writes_nothing(case, run, tmp_path, capsys):
    out, source = tmp_path / "out", run
    if case in ("not-empty", "not-an-export"):
        out.mkdir()
        (out / "piece.mid").write_bytes(b"MThd")
    if case == "inside-run":
        out = run / "exported"
    if case == "run-itself":
        out = run
    if case == "no-checkpoint":
        source = tmp_path / "missing"
    if case == "broken-checkpoint":
        source = tmp_path / "broken"
        source.mkdir()
        (source / "model.safetensors").write_bytes(b"not a checkpoint")
    before = _listing(tmp_path), _listing(run)
    args = ["export", str(source), "--out", str(out)] + (["--overwrite"] if case == "not-an-export" else [])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    expected = {"not-empty": "not empty", "inside-run": "inside the run folder", "run-itself": "the run folder",
                "no-checkpoint": "missing", "not-an-export": "model_type 'spe'", "broken-checkpoint": "broken"}
    assert expected[case] in err
    assert (_listing(tmp_path), _listing(run)) == before


def test_greedy_generate_gives_the_piece_of_spe_generate(run, tmp_path):
    """transformers' greedy decoding with the REMI grammar as a logits processor writes the MIDI
    that `spe generate` writes at a vanishing temperature, from the same prompt."""
    from spe.lab.music.grammar import REMIGrammar
    from spe.lab.music.corpus import tokenizer_from_json
    from spe.lab.music.generation import prompt_ids

    prompt = run.parent / "clean_midi" / "piece0.mid"
    assert main(["generate", "--checkpoint", str(run), "--prompt", str(prompt), "--prompt-bars", "1",
                 "--length", "48", "--temperature", "1e-30", "--out", str(tmp_path / "spe.mid"),
                 "--threads", "1", "--no-progress"]) == 0
    loaded = spe.load(run)
    tokenizer = tokenizer_from_json(loaded.tokenizer_json)
    grammar = REMIGrammar(tokenizer)

    def remi_grammar(input_ids, scores):
        allowed = torch.stack([grammar.allowed_next(row.tolist()) for row in input_ids])
        return scores.masked_fill(~allowed, float("-inf"))

    model = SPEForCausalLM.from_spe(loaded.model)
    start = torch.tensor([prompt_ids(tokenizer, prompt, 1)])
    ids = model.generate(start, max_new_tokens=48, do_sample=False, logits_processor=LogitsProcessorList([remi_grammar]))
    tokenizer.decode(ids[0].tolist()).dump_midi(tmp_path / "hf.mid")
    ours, theirs = Score(str(tmp_path / "spe.mid")), Score(str(tmp_path / "hf.mid"))
    notes = [[(n.time, n.duration, n.pitch, n.velocity) for n in t.notes] for t in ours.tracks]
    assert notes and notes == [[(n.time, n.duration, n.pitch, n.velocity) for n in t.notes] for t in theirs.tracks]
    assert os.path.getsize(tmp_path / "spe.mid") == os.path.getsize(tmp_path / "hf.mid")


def test_export_without_transformers_says_how_to_install_it(run, tmp_path):
    import subprocess
    import sys

    from tiny_run import subprocess_env

    code = ("import sys; sys.modules['transformers'] = None\n"
            "from spe.lab.cli.main import main\n"
            f"sys.exit(main(['export', {str(run)!r}, '--out', {str(tmp_path / 'out')!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env())
    assert done.returncode == 2 and "pip install 'spe[hf]'" in done.stderr
    assert done.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


def test_a_classifier_exports_without_a_tokenizer(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from spe.models import ClassifierConfig, EncoderClassifier

    torch.manual_seed(0)
    classifier = EncoderClassifier(ClassifierConfig(vocab_size=20, num_classes=4, d_model=16, num_layers=1,
                                                    num_heads=2, d_ff=32, num_realizations=4, num_features=8))
    spe.save(classifier, tmp_path / "lra-run")
    assert main(["export", str(tmp_path / "lra-run"), "--out", str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "tokenizer.json").exists()
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out")
    tokens = torch.randint(2, 20, (2, 9), generator=torch.Generator().manual_seed(1))
    assert torch.equal(model(tokens).logits, spe.load(tmp_path / "lra-run").model(tokens))

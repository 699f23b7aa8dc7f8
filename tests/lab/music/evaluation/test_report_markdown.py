"""The report's header and extrapolation table say what was evaluated: the evaluated length as a
multiple of the training length, and the unigram's one figure labelled as over all positions."""

from spe.lab.music.evaluation.report_markdown import render_extrapolation, render_header


def _report(seq_lens: list[int], max_length: int) -> dict:
    config = {"positional": "ape", "attention": "performer", "gated": False, "num_realizations": 32}
    models = [{"name": f"m{i}", "checkpoint": f"runs/m{i}", "config": config, "seq_len": n, "step": 5}
              for i, n in enumerate(seq_lens)]
    summary = {"max_length": max_length, "num_validation_pieces": 20, "num_sequences": 18, "unigram": 2.809,
               "models": [{"label": "ape/performer", "seq_len": n, "within": 1.1, "beyond": 1.4} for n in seq_lens]}
    return {"models": models, "extrapolation": summary, "date": "today", "spe_version": "0", "device": "cpu",
            "data": "bach"}


def test_the_header_gives_the_evaluated_length_as_a_multiple_of_the_training_length():
    text = "\n".join(render_header(_report([256, 256], 768)))
    assert "Evaluated positions: 768 (3 × the training length of 256;" in text
    text = "\n".join(render_header(_report([128, 256], 384)))
    assert "Evaluated positions: 384 (1.5 × the longest training length of 256;" in text


def test_the_unigram_row_says_its_figure_covers_every_position():
    rows = [line for line in render_extrapolation(_report([256], 768)) if line.startswith("| unigram")]
    assert rows == ["| unigram (all 768 positions) | – | – | 2.809 |  |"]

"""Two runs that differ only in their decay, or only in their clock, get different names in every
place a run is named: spe evaluate's table, CSV header, plot legend and summary.json, spe report's
rows and spe sweep's table."""

import json

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from spe.checkpoint import LoadedCheckpoint
from spe.lab.music.split import CorpusSplit
from spe.lab.music.evaluation.checkpoints import evaluate_models, summary_table, write_evaluation
from spe.lab.music.evaluation.report_markdown import render_extrapolation, render_header
from spe.lab.music.plan import results_table
from spe.lab.plans import load_plan
from spe.lab.labels import run_label
from spe.models import ModelConfig
from spe.models.decoder_lm import DecoderLM

SMALL = {"vocab_size": 20, "d_model": 16, "num_layers": 1, "num_heads": 2, "d_ff": 32, "num_features": 8,
         "num_realizations": 4}

# (first model's options, second's, the part of the second's label that names the difference)
PAIRS = {
    "decay": ({"decay": "none"}, {"decay": "fixed"}, "decay fixed"),
    "forget gate": ({}, {"decay": "gated"}, "decay gated"),
    "spe clock": ({"spe_time": "index"}, {"spe_time": "learned"}, "learned time"),
    "rope clock": ({"positional": "rope"}, {"positional": "rope", "rope_time": "learned"}, "learned time"),
}


@pytest.mark.parametrize(("first", "second", "named"), PAIRS.values(), ids=PAIRS.keys())
def test_run_label_names_decay_and_clock_and_leaves_out_defaults(first, second, named):
    a, b = ModelConfig(**SMALL, attention_window=256, **first), ModelConfig(**SMALL, attention_window=256, **second)
    assert run_label(a) != run_label(b)
    assert named in run_label(b) and named not in run_label(a)
    assert run_label(b).endswith("window 256")
    # a checkpoint header's dict names it as the config does; an old header without the option reads its default
    assert run_label(vars(b)) == run_label(b)
    assert run_label({"positional": "sinespe", "attention": "performer"}) == "sinespe/performer"


def _loaded(options: dict, name: str) -> LoadedCheckpoint:
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(**SMALL, **options))
    return LoadedCheckpoint(path=f"runs/{name}", model=model, metadata={"train": {"seq_len": 32}})


@pytest.mark.parametrize(("first", "second", "named"), PAIRS.values(), ids=PAIRS.keys())
def test_evaluate_names_each_run_in_table_csv_legend_and_summary(first, second, named, tmp_path, monkeypatch):
    loaded = [_loaded(first, "a"), _loaded(second, "b")]
    pieces = [np.arange(100) % 20, (np.arange(100) * 7) % 20]
    split = CorpusSplit(train_pieces=pieces, val_pieces=pieces, tokenizer_json="{}")
    summary = evaluate_models(loaded, split, max_length=64)
    legends = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: (legends.append(
        [t.get_text() for t in fig.axes[0].get_legend().get_texts()]), close(fig)))
    write_evaluation(summary, tmp_path)

    labels = [run_label(c.config) for c in loaded]
    assert labels[0] != labels[1] and named in labels[1]
    stored = json.loads((tmp_path / "summary.json").read_text())
    assert [m["label"] for m in stored["models"]] == labels
    assert (tmp_path / "per_position.csv").read_text().splitlines()[0] == \
        "position," + ",".join(f'"{label}"' for label in labels) + ",unigram"
    assert legends == [[*labels, "unigram"]]
    table = summary_table(summary)
    assert all(f"| {label} |" in table for label in labels)

    # spe report: the run column of "What was run" and of the extrapolation table
    report = {"date": "today", "spe_version": "0", "device": "cpu", "data": "d",
              "models": [{"name": n, "checkpoint": c.path, "step": 1, "seq_len": 32, "config": vars(c.config)}
                         for n, c in zip("ab", loaded)],
              "extrapolation": {**summary, "num_validation_pieces": 2}}
    for lines in (render_header(report), render_extrapolation(report)):
        rows = [line for line in lines if line.startswith(("| a |", "| b |"))]
        assert [f" {label} |" in row for row, label in zip(rows, labels)] == [True, True], rows


SWEEP_PLAN = """
title = "labels"
seq_len = 16
model = { d_model = 16, num_layers = 1, num_heads = 2, d_ff = 32, num_realizations = 4 }
[variants.plain]
model = { positional = "sinespe" }
[variants.decay]
model = { positional = "sinespe", decay = "fixed" }
[variants.learned]
model = { positional = "sinespe", spe_time = "learned" }
"""


def test_the_sweep_table_names_each_variant_s_run(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(SWEEP_PLAN)
    plan = load_plan(str(path), "music")
    runs = {f"{v}/seed0": {"variant": v, "seed": 0, "buckets": [{"start": 0, "end": 16, "ce": 1.0}]}
            for v in plan.rows}
    lines = {line.split(" | ")[0]: line for line in results_table({"runs": runs}, plan) if line.startswith("| ")}
    # seq_len 16: SPE models train with a window of the training length
    assert "| sinespe/performer window 16 |" in lines["| plain"]
    assert "| sinespe/performer decay fixed window 16 |" in lines["| decay"]
    assert "| sinespe/performer learned time window 16 |" in lines["| learned"]


def test_the_training_progress_line_names_the_run(tmp_path):
    from tiny_run import tiny_config

    from spe.lab.music.task import LMTask

    labels = []
    for options in ({}, {"decay": "fixed"}, {"spe_time": "learned"}):
        task = LMTask(tiny_config(tmp_path, "run", model={"positional": "sinespe", **options}), progress=False)
        task.vocab_size, task.model_settings = 20, {}
        task.build_model()
        labels.append(task.label)
    assert labels == ["train sinespe/performer window 32", "train sinespe/performer decay fixed window 32",
                      "train sinespe/performer learned time window 32"]

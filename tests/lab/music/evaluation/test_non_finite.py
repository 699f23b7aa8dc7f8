"""spe evaluate never reports a NaN cross-entropy (written as null) without saying which model and where."""

import numpy as np
import pytest
import torch

from spe.checkpoint import LoadedCheckpoint
from spe.lab.music.split import CorpusSplit
from spe.lab.music.evaluation.checkpoints import evaluate_models
from spe.models import ModelConfig
from spe.models.decoder_lm import DecoderLM


class OverflowingLM(DecoderLM):
    """Finite weights, but logits that overflow to NaN from position 40 on (as a model may far beyond L)."""

    def forward(self, tokens, **kwargs):
        logits = super().forward(tokens, **kwargs).clone()
        logits[:, 40:] = float("nan")
        return logits


def test_non_finite_cross_entropies_are_warned_about_naming_the_model_and_the_buckets():
    torch.manual_seed(0)
    model = OverflowingLM(ModelConfig(vocab_size=20, d_model=16, num_layers=1, num_heads=2, d_ff=32, num_features=8))
    loaded = LoadedCheckpoint(path="runs/overflow", model=model, metadata={"train": {"seq_len": 32}})
    pieces = [np.arange(120) % 20, (np.arange(120) * 7) % 20]
    split = CorpusSplit(train_pieces=pieces, val_pieces=pieces, tokenizer_json="{}")
    with pytest.warns(UserWarning) as caught:
        summary = evaluate_models([loaded], split, max_length=96)
    message = ("runs/overflow (sinespe/performer): 112 of 192 cross-entropies are NaN or infinite, in the bucket(s) "
               "of positions 32–64, 64–96: their means are NaN (null in summary.json)")
    assert [str(w.message) for w in caught] == [message]
    row = summary["models"][0]
    assert np.isnan(row["beyond"]) and not np.isnan(row["within"])

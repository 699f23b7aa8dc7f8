"""Accuracy of an encoder classifier on an LRA split, and batches cut to their longest sequence.

Letters: B = batch, L = length, K = classes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.lab.lra.data.dataset import PairDataset, SequenceDataset
from spe.models.encoder_classifier import EncoderClassifier
from spe.lab.engine import distributed as dist_

__all__ = ["accuracy", "correct_count", "model_inputs"]


def model_inputs(dataset: SequenceDataset | PairDataset, index: Tensor, device) -> tuple[tuple, Tensor]:
    """The model's positional inputs and the (B,) labels of examples ``index``.

    Each batch is cut to its longest sequence (the rest is padding, which the model masks
    anyway), so short ListOps expressions cost what they hold, not the split's maximum.

    Returns:
        ``(tokens, lengths)`` or ``(tokens1, lengths1, tokens2, lengths2)`` on ``device``, and labels.
    """
    parts = dataset.batch(index)
    labels = parts[-1].to(device)
    inputs = []
    for tokens, lengths in zip(parts[:-1:2], parts[1:-1:2]):
        inputs += [tokens[:, :max(int(lengths.max()), 1)].to(device), lengths.to(device)]
    return tuple(inputs), labels


def _lengths(dataset: SequenceDataset | PairDataset) -> Tensor:
    if isinstance(dataset, PairDataset):
        return torch.maximum(dataset.lengths1, dataset.lengths2)
    return dataset.lengths


@torch.no_grad()
def accuracy(model: EncoderClassifier, dataset: SequenceDataset | PairDataset, *, batch_size: int = 64,
             limit: int = 0, device: str | torch.device = "cpu") -> float:
    """Share of correctly classified examples, in eval mode (the model's mode is restored).

    Args:
        model: the classifier.
        dataset: a split from :func:`spe.lab.lra.data.load_task`.
        batch_size: examples per forward pass; they are grouped by length (least padding).
        limit: use the first ``limit`` examples only (0: all), always the same ones.
        device: where the batches go.

    Returns:
        Accuracy in [0, 1] (0 for an empty split).
    """
    was_training = model.training
    model.eval()
    try:
        correct, n = correct_count(model, dataset, batch_size=batch_size, limit=limit, device=torch.device(device))
    finally:
        model.train(was_training)
    return correct / n if n else 0.0


@torch.no_grad()
def correct_count(model: EncoderClassifier, dataset: SequenceDataset | PairDataset, *, batch_size: int,
                  limit: int = 0, device: torch.device, ctx: dist_.Distributed | None = None) -> tuple[int, int]:
    """(correctly classified, evaluated) over the first ``limit`` examples (0: all), summed over processes.

    The examples are ordered by length (least padding), ``batch_size`` a batch. Under
    ``torchrun`` (``ctx``) process r of N takes batches r, r + N, ..., so every batch, hence
    every prediction, is the one a single process computes.
    """
    ctx = ctx or dist_.Distributed()
    n = len(dataset) if not limit else min(limit, len(dataset))
    order = torch.argsort(_lengths(dataset)[:n], stable=True)
    correct = 0
    for start in list(range(0, n, batch_size))[ctx.rank::ctx.world_size]:
        inputs, labels = model_inputs(dataset, order[start:start + batch_size], device)
        correct += int((model(*inputs).argmax(-1) == labels).sum())
    (total,) = dist_.all_sum([float(correct)], ctx, device)
    return int(total), n

"""Teacher-forced cross-entropy per token position, within and beyond the training length.

Letters: N = sequences, T = evaluated positions.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from spe.models.decoder_lm import DecoderLM
from spe.models.loss import cross_entropy

__all__ = ["bucket_means", "per_position_cross_entropy", "unigram_cross_entropy"]


@torch.no_grad()
def per_position_cross_entropy(model: DecoderLM, sequences: Tensor, *, batch_size: int = 8,
                               num_realizations: int | None = None, num_draws: int = 1,
                               code_seed: int | None = None, progress: bool = False) -> Tensor:
    """Cross-entropy of each next token given all before it.

    Args:
        model: the language model (evaluated in eval mode).
        sequences: (N, T + 1) token ids.
        batch_size: sequences per forward pass.
        num_realizations: SPE realisations R at test time (default: the model's).
        num_draws: SPE codes to average the predicted probabilities over (codes from
            ``code_seed``, ``code_seed + 1``, …): a Monte-Carlo average over the positional
            noise, at ``num_draws`` times the cost. Ignored without SPE.
        code_seed: seed of the first code (default: ``model.config.code_seed``, the code
            the model uses in eval mode). Each draw gets its own explicit generator; the
            model is not modified.
        progress: show a progress bar over batches.

    Returns:
        (N, T) nats; entry [i, t] is −log p(x[i, t+1] | x[i, :t+1]).

    Raises:
        ValueError: if ``num_draws`` < 1.
    """
    if num_draws < 1:
        raise ValueError(f"num_draws must be at least 1, got {num_draws}")
    if model.encoding is None:
        num_draws = 1
    model.eval()
    device = next(model.parameters()).device
    seed = model.config.code_seed if code_seed is None else code_seed
    rows = []
    batches = range(0, len(sequences), batch_size)
    if progress:
        from tqdm import tqdm

        batches = tqdm(batches, desc="evaluate", unit="batch")
    for i in batches:
        x = sequences[i:i + batch_size].to(device)
        logps = []
        for draw in range(num_draws):
            # a fresh generator per batch and draw: every batch sees the codes of seed, seed + 1, ...
            code_gen = torch.Generator().manual_seed(seed + draw)
            logits = model(x[:, :-1], num_realizations=num_realizations, generator=code_gen)
            logps.append(-cross_entropy(logits, x[:, 1:], reduction="none").double())
        ce = -(torch.logsumexp(torch.stack(logps), dim=0) - math.log(num_draws))
        rows.append(ce.float().cpu())
    return torch.cat(rows) if rows else torch.zeros(0, sequences.shape[1] - 1)


def unigram_cross_entropy(train_pieces: list[np.ndarray], sequences: Tensor, vocab_size: int) -> Tensor:
    """Cross-entropy of the targets of (N, T + 1) sequences under the training unigram.

    Uses add-one smoothing over the vocabulary. Returns (N, T) nats.
    """
    counts = np.bincount(np.concatenate(train_pieces), minlength=vocab_size).astype(np.float64) + 1.0
    logp = torch.from_numpy(np.log(counts / counts.sum())).float()
    return -logp[sequences[:, 1:]]


def bucket_means(ce: Tensor, width: int) -> list[dict]:
    """Means over buckets of positions [k·width, (k+1)·width).

    Args:
        ce: (N, T) per-position cross-entropy.
        width: bucket width in positions (e.g. the training length).

    Returns:
        One dict per bucket: ``start``, ``end``, ``ce`` (mean nats/token), ``std`` (standard
        deviation of the per-sequence bucket means), ``n`` (sequences).
    """
    out = []
    for start in range(0, ce.shape[1], width):
        block = ce[:, start:start + width]
        per_seq = block.mean(1)
        out.append({"start": start, "end": start + block.shape[1], "ce": float(block.mean()),
                    "std": float(per_seq.std()) if len(per_seq) > 1 else math.nan, "n": len(per_seq)})
    return out

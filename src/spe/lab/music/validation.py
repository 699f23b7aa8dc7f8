"""Validation cross-entropy of a model on (N, T + 1) token sequences, and the loss plot of a run."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from spe.checkpoint import atomic_write
from spe.models.decoder_lm import DecoderLM
from spe.models.loss import cross_entropy
from spe.lab.engine.precision import autocast

__all__ = ["plot_losses", "validation_loss", "validation_sums"]


def validation_sums(model: DecoderLM, batch: torch.Tensor, *, batch_size: int, device,
                    precision: str = "fp32", start: int = 0) -> tuple[float, int]:
    """(sum of next-token cross-entropies in nats, count) over positions >= ``start`` of (N, T + 1) sequences.

    The model is called as it is (train or eval mode), under ``precision``'s autocast.
    """
    total, count = 0.0, 0
    for i in range(0, len(batch), batch_size):
        x = batch[i:i + batch_size].to(device)
        with autocast(precision, torch.device(device).type):
            logits = model(x[:, :-1])
        targets = x[:, 1 + start:]
        total += float(cross_entropy(logits[:, start:], targets, reduction="sum"))
        count += targets.numel()
    return total, count


@torch.no_grad()
def validation_loss(model: DecoderLM, batch: torch.Tensor, *, batch_size: int, device) -> float:
    """Mean next-token cross-entropy (nats) over (N, L + 1) sequences, in eval mode."""
    was_training = model.training
    model.eval()
    total, count = validation_sums(model, batch, batch_size=batch_size, device=torch.device(device))
    model.train(was_training)
    return total / max(count, 1)


def plot_losses(metrics_path: Path, png: Path) -> None:
    """Training and validation cross-entropy against the step, metrics.jsonl -> PNG (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional
        return
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], lw=0.6, alpha=0.6, label="training crops")
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    if val:
        ax.plot(*zip(*val), "o-", label="validation")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("Training")
    ax.legend()
    fig.tight_layout()
    atomic_write(png, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)

"""The one cross-entropy of the package: next-token prediction and classification alike.

Letters: B = batch, L = positions, V = vocabulary (or classes).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["cross_entropy"]


def cross_entropy(logits: Tensor, targets: Tensor, *, reduction: str = "mean") -> Tensor:
    """Cross-entropy in nats, computed in float32 whatever the logits' precision.

    Used for next-token prediction (``logits`` (B, L, V) of ``tokens[:, :-1]``, ``targets``
    ``tokens[:, 1:]`` (B, L)) and for classification (``logits`` (B, V), ``targets`` (B,)).

    Args:
        logits: (..., V) unnormalised log-probabilities (bf16/fp16 logits are upcast, so the
            log-sum-exp never rounds in half precision).
        targets: (...) integer ids in [0, V); −100 marks a position without a target (PyTorch's
            ``ignore_index``, transformers' convention): it adds nothing, and ``"mean"`` averages
            over the others.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Returns:
        A scalar for ``"mean"``/``"sum"``; (...) per-target nats for ``"none"``.

    Raises:
        ValueError: if the leading shapes of ``logits`` and ``targets`` differ.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}: "
                         "expected logits (..., V) and targets (...)")
    flat = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction)
    return flat.reshape(targets.shape) if reduction == "none" else flat

"""The optimizer of every training run: AdamW, its one parameter-group rule, and the learning-rate schedules.

The parameter-group rule is decided by module type, not by parameter names:

* weight decay applies to the weight matrices of ``nn.Linear`` layers (attention
  projections, feed-forward layers, output and classification heads);
* it never applies to embeddings (nor to a head tied to the embedding: the same tensor),
  norms, biases, or any parameter of a positional-encoding module, i.e. of a module whose
  class is defined in the :mod:`spe.encodings` package (SPE frequencies, phases, gains and
  filters, the SPE gates of :class:`~spe.encodings.filter.SPEFilter`, learned absolute
  embeddings, Shaw and Music Transformer relative embeddings), even where such a module
  holds an ``nn.Linear``.

Decaying a positional parameter pulls it towards zero: for an SPE gate that means a gate
halfway open whatever the data says; for sineSPE gains it means no positional signal.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["ADAM_BETAS", "SCHEDULES", "adamw", "decayed_parameter_names", "is_positional_module",
           "learning_rate_factor", "param_groups"]

ADAM_BETAS = (0.9, 0.98)
SCHEDULES = ("cosine", "rsqrt")
_POSITIONAL_PACKAGE = "spe.encodings"


def is_positional_module(module: nn.Module) -> bool:
    """Whether ``module``'s class is a positional encoding (defined in the :mod:`spe.encodings` package)."""
    name = type(module).__module__
    return name == _POSITIONAL_PACKAGE or name.startswith(_POSITIONAL_PACKAGE + ".")


def _decayed_ids(model: nn.Module) -> set[int]:
    """ids of the parameters the rule decays (see the module docstring)."""
    excluded: set[int] = set()
    for module in model.modules():
        if is_positional_module(module) or isinstance(module, nn.Embedding):
            excluded |= {id(p) for p in module.parameters()}
    return {id(m.weight) for m in model.modules()
            if isinstance(m, nn.Linear) and id(m.weight) not in excluded}


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: ``[{decayed weight matrices, weight_decay}, {the rest, 0.0}]``.

    Parameters keep ``model.named_parameters()`` order within each group (optimizer states
    are saved by position); frozen parameters (``requires_grad=False``) are left out; a
    tensor shared by two modules (a tied head) appears once.

    Args:
        model: any ``nn.Module`` (a :class:`~spe.DecoderLM`, an
            :class:`~spe.models.EncoderClassifier`).
        weight_decay: AdamW's decoupled decay of the first group (per step, times the lr).
    """
    decayed = _decayed_ids(model)
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if id(p) in decayed else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def decayed_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters :func:`param_groups` decays (for tests and logs)."""
    decayed = _decayed_ids(model)
    return [name for name, p in model.named_parameters() if id(p) in decayed and p.requires_grad]


def adamw(model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW (β = 0.9, 0.98, ε = 1e-8) over :func:`param_groups`."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=ADAM_BETAS)


def learning_rate_factor(step: int, *, steps: int, warmup_steps: int, schedule: str = "cosine",
                         min_lr_ratio: float = 0.0) -> float:
    """lr(step) / peak lr for optimizer step ``step`` (0-based).

    Linear warmup over ``warmup_steps`` ((step + 1) / warmup), then either

    * ``cosine``: half a cosine from 1 down to ``min_lr_ratio`` at ``steps`` (flat after), or
    * ``rsqrt``: sqrt(warmup / (step + 1)), the Long Range Arena's ``rsqrt_decay``.

    Raises:
        ValueError: for an unknown schedule.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "rsqrt":
        return math.sqrt(max(warmup_steps, 1) / (step + 1))
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

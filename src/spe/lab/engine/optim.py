"""The optimizer of every training run: AdamW, its one parameter-group rule, and the learning-rate schedules.

The parameter-group rule is decided by module type, not by parameter names:

* weight decay applies to the weight matrices of ``nn.Linear`` layers (attention
  projections, feed-forward layers, output and classification heads);
* it never applies to embeddings (nor to a head tied to the embedding: the same tensor),
  norms, biases, or any parameter of a positional-encoding module, i.e. of a module whose
  class is defined in the :mod:`spe.encodings` package (SPE frequencies, phases, gains and
  filters, the SPE gates of :class:`~spe.encodings.filter.SPEFilter`, learned absolute
  embeddings, Shaw and Music Transformer relative embeddings, the short convolution of
  queries, keys and values, the forget gates of ``decay="gated"``/``"gated-channel"``), even
  where such a module holds an ``nn.Linear``.

Decaying a positional parameter pulls it towards zero: for an SPE gate that means a gate
halfway open whatever the data says; for sineSPE gains it means no positional signal.

The same positional parameters may learn at a multiple of the learning rate
(``positional_lr_scale``): they then form a third group whose ``lr_scale`` the
training engine multiplies into every step's learning rate. At 1.0 the groups are exactly the
two above, so optimizer states saved before the option existed still load.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from spe.lab.options import SCHEDULES, check_option  # named beside the option's rule (no torch there)

__all__ = ["ADAM_BETAS", "SCHEDULES", "adamw", "check_lr_scale", "decayed_parameter_names", "is_positional_module",
           "learning_rate_factor", "param_groups", "scaled_lr"]

ADAM_BETAS = (0.9, 0.98)
_POSITIONAL_PACKAGE = "spe.encodings"


def is_positional_module(module: nn.Module) -> bool:
    """Whether ``module``'s class is a positional encoding (defined in the :mod:`spe.encodings` package)."""
    name = type(module).__module__
    return name == _POSITIONAL_PACKAGE or name.startswith(_POSITIONAL_PACKAGE + ".")


def _positional_ids(model: nn.Module) -> set[int]:
    """ids of the parameters of positional-encoding modules (see the module docstring)."""
    return {id(p) for module in model.modules() if is_positional_module(module) for p in module.parameters()}


def _decayed_ids(model: nn.Module) -> set[int]:
    """ids of the parameters the rule decays (see the module docstring)."""
    excluded = _positional_ids(model)
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            excluded |= {id(p) for p in module.parameters()}
    return {id(m.weight) for m in model.modules()
            if isinstance(m, nn.Linear) and id(m.weight) not in excluded}


def check_lr_scale(value: float, name: str = "positional_lr_scale") -> float:
    """A learning-rate multiplier: a finite number > 0 (bools refused), the option's own rule
    (:data:`spe.lab.options.OPTION_RULES`), as a float.

    Raises:
        ValueError: naming ``name`` and the value.
    """
    check_option("positional_lr_scale", value, name)
    return float(value)


def param_groups(model: nn.Module, weight_decay: float, *, positional_lr_scale: float = 1.0) -> list[dict]:
    """AdamW parameter groups: ``[{decayed weight matrices, weight_decay}, {the rest, 0.0}]``, and with
    ``positional_lr_scale`` ≠ 1 a third, ``{positional parameters, 0.0, lr_scale}``, taken out of the second.

    Parameters keep ``model.named_parameters()`` order within each group (optimizer states
    are saved by position); frozen parameters (``requires_grad=False``) are left out; a
    tensor shared by two modules (a tied head) appears once. The positional group carries
    ``lr_scale``, the factor the engine applies to the scheduled lr (absent: 1).

    Args:
        model: any ``nn.Module`` (a :class:`~spe.DecoderLM`, an
            :class:`~spe.models.EncoderClassifier`).
        weight_decay: AdamW's decoupled decay of the first group (per step, times the lr).
        positional_lr_scale: learning-rate multiplier of the parameters of positional-encoding
            modules (SPE frequencies, gains, filters and gates, learned embeddings …).

    Raises:
        ValueError: if ``positional_lr_scale`` is not a finite number > 0.
    """
    scale = check_lr_scale(positional_lr_scale)
    decayed = _decayed_ids(model)
    positional = _positional_ids(model) if scale != 1.0 else set()
    decay, no_decay, scaled = [], [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if id(p) in decayed else scaled if id(p) in positional else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if positional:
        groups.append({"params": scaled, "weight_decay": 0.0, "lr_scale": scale})
    return groups


def decayed_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters :func:`param_groups` decays (for tests and logs)."""
    decayed = _decayed_ids(model)
    return [name for name, p in model.named_parameters() if id(p) in decayed and p.requires_grad]


def adamw(model: nn.Module, *, lr: float, weight_decay: float, positional_lr_scale: float = 1.0) -> torch.optim.AdamW:
    """AdamW (β = 0.9, 0.98, ε = 1e-8) over :func:`param_groups`; each group starts at ``lr × lr_scale``
    (:func:`scaled_lr`).

    Raises:
        ValueError: as :func:`param_groups`.
    """
    groups = param_groups(model, weight_decay, positional_lr_scale=positional_lr_scale)
    for group in groups:
        if "lr_scale" in group:
            group["lr"] = scaled_lr(group, lr)
    return torch.optim.AdamW(groups, lr=lr, betas=ADAM_BETAS)


def scaled_lr(group: dict, lr: float) -> float:
    """The learning rate of an optimizer group when the schedule says ``lr``: ``lr × group["lr_scale"]``
    (groups without one, e.g. of optimizer states saved before the option existed, take ``lr`` itself)."""
    return lr * group["lr_scale"] if "lr_scale" in group else lr


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

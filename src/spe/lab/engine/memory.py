"""Sizes checked against the machine before anything is allocated.

A configuration can pass every rule (positive integers) and still ask for more memory than
exists (``d_ff = 10^11``, ``short_conv = 2^63 − 1``, ``num_realizations = 10^8``): PyTorch would
then fail in its allocator, with a traceback or the kernel's OOM killer. The model is built on
the ``meta`` device (shapes only, no storage, no random numbers drawn) and its needs compared
with the device's memory first.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["check_model_memory", "device_memory", "format_bytes"]

# weights, gradients and AdamW's two moments, per parameter
_COPIES = 4
_SIZES = ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "short_conv", "num_realizations")


def format_bytes(n: float) -> str:
    """``1.5 GB`` (decimal units)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError  # unreachable


def device_memory(device: torch.device | str) -> int:
    """Bytes of memory of ``device``: a CUDA device's total, else the machine's physical memory."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _sizes(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    given = [(name, getattr(config, name)) for name in _SIZES if getattr(config, name, None) is not None]
    return ", ".join(f"{name} {value:,}" for name, value in given)


def _code_bytes(model: nn.Module, positions: int) -> int:
    """Bytes of the SPE codes of ``positions`` positions, H·D·R floats per position and encoding
    (a lower bound of what a step holds: q̂ and k̂ of every sequence are as large)."""
    return sum(4 * positions * m.num_heads * m.head_dim * m.num_realizations for m in model.modules()
               if all(isinstance(getattr(m, a, None), int) for a in ("num_heads", "head_dim", "num_realizations")))


def check_model_memory(build: Callable[[], nn.Module], device: torch.device | str, *, positions: int = 1) -> None:
    """Raises ValueError (one line, naming the sizes) if the model ``build`` makes cannot fit.

    Args:
        build: makes the model (called once under ``torch.device("meta")``: no storage).
        device: where it will train.
        positions: the training length (positions with an SPE code each).

    Raises:
        ValueError: if a tensor's size overflows, or the parameters' weights, gradients and
            AdamW moments (16 bytes each in float32) plus the SPE codes of ``positions`` exceed the
            device's memory.
    """
    try:
        with torch.device("meta"):
            model = build()
    except (RuntimeError, OverflowError) as err:  # a size beyond what a tensor can have
        raise ValueError(f"the model's sizes cannot be allocated on any machine ({' '.join(str(err).split())}): "
                         "lower them") from None
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    need = _COPIES * params + _code_bytes(model, positions)
    have = device_memory(device)
    if need > have:
        raise ValueError(f"the model needs at least {format_bytes(need)} (weights, gradients and AdamW moments of "
                         f"{format_bytes(params)} of parameters, and the SPE code) but {torch.device(device).type} "
                         f"memory is {format_bytes(have)}: lower its sizes ({_sizes(model)})")

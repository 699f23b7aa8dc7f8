"""Mixed precision for training: ``fp32`` (default), ``bf16`` or ``fp16`` autocast.

Weights, optimizer states and checkpoints stay float32 (autocast only changes the dtype
of some matrix products' inputs); the kernels keep their feature maps, SPE phases and
normalising sums in float32 themselves. ``fp16`` needs a CUDA device and a gradient scaler
(its 5-bit exponent underflows small gradients); bf16 has float32's range and needs none.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["PRECISIONS", "autocast", "check_precision", "grad_scaler"]

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device_type: str) -> None:
    """Raises ValueError for an unknown precision, or fp16 on a CPU."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp16" and device_type != "cuda":
        raise ValueError("precision fp16 needs a CUDA device (PyTorch's CPU autocast and gradient scaler are "
                         "for bf16): use --precision bf16 or fp32 on CPU")


def autocast(precision: str, device_type: str):
    """The autocast context of ``precision`` (a no-op context for fp32)."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def grad_scaler(precision: str, device_type: str) -> torch.amp.GradScaler:
    """A gradient scaler, enabled for fp16 only (a pass-through otherwise)."""
    return torch.amp.GradScaler(device_type, enabled=precision == "fp16")

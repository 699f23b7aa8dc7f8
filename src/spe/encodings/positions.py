"""Shared argument handling for positional codes."""

from __future__ import annotations

import operator

import torch
from torch import Tensor

__all__ = ["NOISE_DTYPE", "check_code_seed", "code_generator", "require_positive", "resolve_positions"]

# SPE noise (Z, ε) is drawn in this dtype whatever the module dtype, then cast, so that a
# float64 copy of a module draws the same code from the same seed (to float32 rounding).
NOISE_DTYPE = torch.float32


def _as_positions(name: str, value: Tensor, device: torch.device) -> Tensor:
    value = torch.as_tensor(value, device=device)
    if value.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor of positions, got shape {tuple(value.shape)}")
    return value


def resolve_positions(
    length: int | None,
    positions: Tensor | None,
    query_positions: Tensor | None,
    key_positions: Tensor | None,
    *,
    device: torch.device,
    owner: str,
) -> tuple[Tensor, Tensor]:
    """Returns (query_positions (Lq,), key_positions (Lk,)) from exactly one way of asking.

    Raises:
        ValueError: if none or several of the ways are used, or ``length`` is not a positive
            integer (4.5 or True are refused, not truncated).
    """
    given = [length is not None, positions is not None,
             query_positions is not None or key_positions is not None]
    if sum(given) != 1:
        raise ValueError("give exactly one of: length, positions, or query_positions with key_positions")
    if length is not None:
        require_positive(owner, length=length)
        pos = torch.arange(operator.index(length), device=device)
        return pos, pos
    if positions is not None:
        pos = _as_positions("positions", positions, device)
        return pos, pos
    if query_positions is None or key_positions is None:
        raise ValueError("query_positions and key_positions must be given together")
    return (_as_positions("query_positions", query_positions, device),
            _as_positions("key_positions", key_positions, device))


def require_positive(owner: str, **values: int) -> None:
    """Raises ValueError naming the first of ``values`` that is not a positive integer.

    The one check of every size the encodings take (heads, dimensions, realisations, sines,
    kernel sizes, lengths). Integers of any kind pass (Python, NumPy, integer tensors);
    floats, even 2.0, and bools do not: ``torch`` would reject the first later with a
    TypeError, and silently read True as 1.
    """
    for name, value in values.items():
        try:
            number = None if isinstance(value, bool) else operator.index(value)
        except TypeError:
            number = None
        if number is None or number < 1:
            raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}")


def code_generator(module, generator: torch.Generator | None) -> torch.Generator | None:
    """The source of an SPE module's noise: ``generator`` if given; else, in eval mode, a
    generator seeded with the module's ``code_seed`` (so that two eval-mode calls draw the same
    code, as :class:`~spe.DecoderLM` does with ``config.code_seed``); else None (PyTorch's
    default generator: training mode redraws at every call)."""
    if generator is None and not module.training:
        return torch.Generator().manual_seed(module.code_seed)
    return generator


def check_code_seed(owner: str, code_seed) -> int:
    """``code_seed``, checked: an int in [0, 2**63) (what ``torch.Generator.manual_seed`` takes).

    Raises:
        ValueError: naming ``owner`` and the value otherwise.
    """
    if isinstance(code_seed, bool) or not isinstance(code_seed, int) or not 0 <= code_seed < 2 ** 63:
        raise ValueError(f"{owner}: code_seed must be an integer in [0, 2**63), got {code_seed!r}")
    return code_seed

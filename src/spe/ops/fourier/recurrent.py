"""The causal Fourier mixer's decoding step: O(N·C) per token, the same at every position.

Letters: B = batch, N = the DFT length, C = channels.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spe.ops.fourier.mixing import channel_transform, check_length, check_norm, fourier_scale
from spe.ops.fourier.state import FourierState

__all__ = ["fourier_mixing_step"]


def fourier_mixing_step(x: Tensor, state: FourierState | None, length: int, *,
                        norm: str = "backward") -> tuple[Tensor, FourierState]:
    """One position t of causal Fourier mixing: S_f += w^{f t} u_t for every f, y_t = Re(s S_{t mod N}).

    Equal to :func:`~spe.ops.fourier.fourier_mixing` (``causal=True``) position by position. The
    state holds every frequency because each later position reads another one (t mod N) of the
    same prefix: no smaller state serves them all once t ≥ N (the N sums are the prefix's N-point
    DFT, invertible), so a token costs O(N·C), not O(C).

    Args:
        x: (B, 1, C) real, position t = ``state.position`` (0 without a state).
        state: the :class:`FourierState` after position t − 1, or None.
        length: N (the state's, when one is given).
        norm: as :func:`~spe.ops.fourier.fourier_mixing`.

    Returns:
        y (B, 1, C) in x's dtype, and the state after position t.

    Raises:
        ValueError: on x not (B, 1, C), a bad ``norm`` or ``length``, or a state of another shape.
    """
    check_norm(norm)
    n = check_length(length)
    if x.dim() != 3 or x.shape[1] != 1:
        raise ValueError(f"a step takes x of shape (batch, 1, channels), got {tuple(x.shape)}")
    u = channel_transform(x, norm)[:, 0]  # (B, C)
    t = 0 if state is None else state.position
    if state is not None and state.sums.shape != (u.shape[0], n, u.shape[1]):
        raise ValueError(f"the Fourier state holds sums {tuple(state.sums.shape)}, expected "
                         f"(batch, N, channels) = {(u.shape[0], n, u.shape[1])}")
    f = torch.arange(n, device=x.device)
    angle = torch.remainder(f * t, n).double() * (-2 * math.pi / n)  # w^{f t}, reduced in integers
    twiddle = torch.complex(torch.cos(angle), torch.sin(angle)).to(u.dtype)  # (N,)
    sums = twiddle[None, :, None] * u[:, None, :]  # (B, N, C)
    if state is not None:
        sums = sums + state.sums.to(u.dtype)
    y = (sums[:, t % n].real * fourier_scale(n, norm))[:, None].to(x.dtype)
    return y, FourierState(sums=sums, position=t + 1)

"""The slow, obviously correct twin of causal linear attention: cumulative sums of (M × E)
outer products, memory O(L·M·E) (O(L·W·M·E) with a window); for tests (use float64).

Letters: B = batch, L = length, H = num_heads, M = feature dimension of φ, E = value dimension.
The decay forms' reference is :func:`spe.ops.decay.naive.decay_attention_reference`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spe.ops.common.checks import check_window
from spe.ops.linear_attn.options import check_normalizer, full_precision, normalise, normalised, rescale_keys, with_ones

__all__ = ["causal_linear_attention_reference"]


def _prefix_sums(terms: Tensor, window: int | None) -> Tensor:
    # Σ_{n ≤ m} terms_n along dim 1, or with a window Σ_{m−W < n ≤ m} summed from the single
    # terms over the last W positions (the obvious form, for tests; O(L·W) memory).
    if window is None or window >= terms.shape[1]:
        return torch.cumsum(terms, dim=1)
    padded = torch.cat([torch.zeros_like(terms[:, :window - 1]), terms], dim=1)
    return padded.unfold(1, window, 1).sum(-1)


@full_precision
def causal_linear_attention_reference(phi_q: Tensor, phi_k: Tensor, v: Tensor, *,
                                      normalizer: tuple[Tensor, Tensor] | None = None,
                                      window: int | None = None, key_log_scale: Tensor | None = None) -> Tensor:
    """Causal linear attention by cumulative sums; memory O(L·M·E) (O(L·W·M·E) with a window).
    Reference for tests (key scales relative to their overall maximum: use float64).

    Args and returns as :func:`~spe.ops.linear_attn.chunk.causal_linear_attention`.
    """
    check_window(window)
    phi_k, normalizer = rescale_keys(phi_k, normalizer, key_log_scale)
    if normalizer is None:
        states = _prefix_sums(torch.einsum("blhm,blhe->blhme", phi_k, with_ones(v)), window)
        return normalised(torch.einsum("blhm,blhme->blhe", phi_q, states), True)
    nq, nk = check_normalizer(normalizer, phi_q, phi_k)
    num = torch.einsum("blhm,blhme->blhe", phi_q, _prefix_sums(torch.einsum("blhm,blhe->blhme", phi_k, v), window))
    den = torch.einsum("blhm,blhm->blh", nq, _prefix_sums(nk, window))[..., None]
    return normalise(num, den)

"""Translation invariance and monotonicity of a causal attention matrix (appendix D.3, Table 7).

Wang et al. (ICLR 2021, "On position embeddings in BERT") ask of a positional encoding that
the proximity of positions x and x + m depend on the offset m only (translation invariance)
and decrease as m grows (monotonicity). Appendix D.3 of Liutkus et al. (2021) measures both
on unnormalised attention matrices A = exp(Q K^T / sqrt(D)) (APE) or exp(Q^ K^^T / sqrt(R))
(SPE) obtained by *identical word probing* (see :mod:`spe.lab.metrics.probing`), "to eliminate
the impact of applying row-wise softmax with causal masking"; lower is better for both.

Letters: Lq = query length (rows, index m), Lk = key length (columns, index n),
o = m − n = query-key offset (causal entries have o >= 0).

Both metrics read only the entries with query m in ``query_range`` and offset
0 <= o <= ``max_offset`` (and 0 <= n < Lk), so Table 7's columns are, e.g.,
``query_range=(0, 1024), max_offset=127`` for "0 < pos <= 1024, offset < 128" (0-based rows).
Both are invariant to multiplying A by a positive constant, so a probe may subtract a
constant from the logits before exponentiating.
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor

__all__ = ["monotonicity", "translation_invariance"]


def _as_matrix(attn) -> Tensor:
    if isinstance(attn, Tensor):
        a = attn.detach().to("cpu", torch.float64)
    else:
        try:
            a = torch.as_tensor(attn, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"attn must be a tensor or array of numbers, got {type(attn).__name__}") from err
    if a.dim() != 2:
        raise ValueError(f"attn must be a (query_length, key_length) matrix, got shape {tuple(a.shape)}; "
                         "for (num_heads, L, L) probes, evaluate one head at a time")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"attn must not be empty, got shape {tuple(a.shape)}")
    return a


def _int(name: str, value) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


def _causal_entries(attn, query_range, max_offset) -> tuple[Tensor, Tensor]:
    """Gathers the considered entries by (row, offset).

    Returns:
        values (rows, O) float64, entry [i, o] = A[start + i, start + i − o], and valid (rows, O)
        bool marking the entries that exist and are considered; O = max_offset + 1 (capped).

    Raises:
        ValueError: on a bad shape or range, no entry to consider, or a non-finite entry.
    """
    a = _as_matrix(attn)
    num_queries, num_keys = a.shape
    if query_range is None:
        start, stop = 0, num_queries
    else:
        try:
            start, stop = query_range
        except (TypeError, ValueError):
            raise ValueError(f"query_range must be a (start, stop) pair, got {query_range!r}") from None
        start, stop = _int("query_range start", start), _int("query_range stop", stop)
        if not 0 <= start < stop <= num_queries:
            raise ValueError(f"query_range must satisfy 0 <= start < stop <= query_length ({num_queries}), "
                             f"got ({start}, {stop})")
    # No causal offset can exceed the last query index: cap O to keep the gather small.
    largest = stop - 1
    if max_offset is not None:
        max_offset = _int("max_offset", max_offset)
        if max_offset < 0:
            raise ValueError(f"max_offset must be >= 0, got {max_offset}")
        largest = min(largest, max_offset)
    rows = torch.arange(start, stop)[:, None]
    keys = rows - torch.arange(largest + 1)[None, :]  # (rows, O) key index n = m − o
    valid = (keys >= 0) & (keys < num_keys)
    if not bool(valid.any()):
        raise ValueError(f"no attention entry has query in [{start}, {stop}) and offset in [0, {largest}] "
                         f"with key_length {num_keys}")
    values = a[rows, keys.clamp(0, num_keys - 1)]
    if not bool(torch.isfinite(values[valid]).all()):
        raise ValueError("attn has NaN or infinite entries in the considered range")
    return values, valid


def translation_invariance(attn, *, query_range: tuple[int, int] | None = None,
                           max_offset: int | None = None) -> float:
    """Share of the attention's variance that is not explained by the query-key offset.

    For the considered entries S (module docstring), grouped into diagonals S_o of fixed
    offset o::

        T = Σ_o |S_o| Var(S_o) / (|S| Var(S))

    i.e. the length-weighted mean over diagonals of the variance along each diagonal, divided
    by the total variance of S (population variances). By the variance decomposition this is
    1 − η², η² being the share of the variance explained by the offset, so T ∈ [0, 1]: 0 when
    A is Toeplitz on S (depends on the offset only), about 1 when the offset says nothing.
    Dividing by the total variance makes T independent of the scale of A, so heads and
    models are comparable (our normalisation: Wang et al. and appendix D.3 state the
    property, not this formula; Table 7's T values also lie in [0, 1]). If every entry of S
    is equal, T = 0 (constant attention is perfectly translation invariant); if S is a single
    diagonal (``max_offset=0``) with unequal entries, T = 1.

    Args:
        attn: (Lq, Lk) unnormalised attention (tensor or array), e.g. exp(q^·k^ / √R). The
            entries are compared as they are; computation is in float64.
        query_range: (start, stop) rows m considered, 0-based and half-open (default all).
        max_offset: largest offset o = m − n considered (default: all causal offsets).

    Returns:
        T in [0, 1] (up to float64 rounding); lower is better.

    Raises:
        ValueError: on a matrix that is not 2-D or empty, a bad range, no entry to consider,
            or NaN/infinite entries among those considered.
        TypeError: on a non-numeric ``attn`` or non-integer range bounds.
    """
    values, valid = _causal_entries(attn, query_range, max_offset)
    # Dividing by the largest magnitude keeps squares of huge exp() entries finite; T is scale-free.
    scale = values[valid].abs().max()
    if scale == 0:
        return 0.0
    x = torch.where(valid, values / scale, 0.0)
    counts = valid.sum(0)  # (O,) entries per diagonal
    diagonal_means = x.sum(0) / counts.clamp(min=1)
    within = torch.where(valid, (x - diagonal_means) ** 2, 0.0).sum()
    mean = x.sum() / valid.sum()
    total = torch.where(valid, (x - mean) ** 2, 0.0).sum()
    if total == 0:
        return 0.0
    return float(within / total)


def monotonicity(attn, *, query_range: tuple[int, int] | None = None, max_offset: int | None = None) -> float:
    """Fraction of key pairs whose attention increases with the offset (inversions).

    Monotonicity (Wang et al. 2021) asks that, in each causal row m, attention decrease as
    the offset o = m − n grows. For every considered row and every pair of its considered
    offsets o1 < o2, the pair is inverted if A[m, m − o2] > A[m, m − o1]; the metric is

        M = (inverted pairs over all rows) / (pairs over all rows),

    pooled over rows, i.e. rows are weighted by their number of pairs c(c − 1)/2 (c keys),
    and rows with a single key contribute nothing. M = 0 for rows strictly decreasing with
    the offset, 1 for rows strictly increasing, ≈ 0.5 for i.i.d. random entries. Ties are not
    inversions ("should not increase"), so a constant row scores 0: position-blind attention
    is trivially monotone by this measure, read it together with :func:`translation_invariance`.
    Scale-free, like all rank statistics.

    Args:
        attn: (Lq, Lk) unnormalised attention (tensor or array); compared in float64.
        query_range: (start, stop) rows m considered, 0-based and half-open (default all).
        max_offset: largest offset o = m − n considered (default: all causal offsets).

    Returns:
        M in [0, 1]; lower is better.

    Raises:
        ValueError: as :func:`translation_invariance`, and when no row has two keys to compare
            (e.g. ``max_offset=0``).
        TypeError: on a non-numeric ``attn`` or non-integer range bounds.
    """
    values, valid = _causal_entries(attn, query_range, max_offset)
    keys_per_row = valid.sum(1).to(torch.float64)
    pairs = float((keys_per_row * (keys_per_row - 1) / 2).sum())
    if pairs == 0:
        raise ValueError("monotonicity needs a row with at least two considered keys; "
                         f"got max_offset={max_offset} and query_range={query_range}")
    # NaN marks entries outside the selection: every comparison with NaN is False, so only
    # pairs of considered entries can count. One pass per lag keeps memory at O(rows · O).
    v = torch.where(valid, values, torch.nan)
    inverted = 0
    for lag in range(1, v.shape[1]):
        inverted += int((v[:, lag:] > v[:, :-lag]).sum())
    return inverted / pairs

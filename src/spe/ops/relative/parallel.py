"""Softmax attention with a relative-position term in the scores: pure kernels.

Letters: B = batch, L = length (Lq queries, Lk keys), H = num_heads, D = head_dim.
Relative position r = j − i of key j seen from query i (r ≤ 0 for causal attention).

* Music Transformer (Huang et al. 2018, "Music Transformer", section 3.4.1): logits
  (q_i·k_j + q_i·e_{j−i}) / √D. The L × L matrix S_rel of q_i·e_{j−i} is computed from the
  L × L (causal) or L × (2L−1) (both directions) product Q Eᵀ by *skewing* (a reshape), so
  no (L, L, D) tensor of gathered embeddings is ever formed: O(L·D) memory beyond the scores.
* Shaw et al. (2018), "Self-attention with relative position representations", eq. (3)–(4):
  logits q_i·(k_j + a^K_ij) / √D and outputs Σ_j α_ij (v_j + a^V_ij), computed explicitly
  with the gathered (Lq, Lk, D) embeddings: O(L²·D) memory, as in the paper.

The explicit twin :func:`~spe.ops.relative.naive.music_relative_attention_reference` gathers
(Lq, Lk, H, D) and is used for single decoding steps (Lq = 1, where it costs O(L·D)) and in tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from spe.ops.relative.checks import check_pair, mask_padding

__all__ = ["music_relative_attention", "relative_shift", "shaw_attention", "skew"]


def skew(rel_logits: Tensor) -> Tensor:
    """The skewing procedure of Huang et al. (2018), causal form.

    Pad a dummy column on the left, reshape (L, L + 1) to (L + 1, L), drop the first row.

    Args:
        rel_logits: (..., L, L), column c holding relative position r = c − (L − 1), i.e. the
            product of each query with the embeddings of r = −(L−1) … 0.

    Returns:
        (..., L, L) with out[..., i, j] = rel_logits[..., i, j − i + L − 1] for j ≤ i; entries
        above the diagonal are meaningless (callers mask them).
    """
    *lead, n, n2 = rel_logits.shape
    if n != n2:
        raise ValueError(f"skew needs a square (L, L) last pair of dimensions, got ({n}, {n2})")
    padded = F.pad(rel_logits, (1, 0))
    return padded.reshape(*lead, n + 1, n)[..., 1:, :]


def relative_shift(rel_logits: Tensor) -> Tensor:
    """Skewing for both directions (non-causal attention).

    Reading the flattened (L, 2L − 1) matrix with a row stride of 2L − 2, starting at element
    L − 1, moves entry (i, j − i + L − 1) to (i, j): the same reshape trick as :func:`skew`.

    Args:
        rel_logits: (..., L, 2L − 1), column c holding relative position r = c − (L − 1).

    Returns:
        (..., L, L) with out[..., i, j] = rel_logits[..., i, j − i + L − 1].
    """
    *lead, n, width = rel_logits.shape
    if width != 2 * n - 1:
        raise ValueError(f"relative_shift needs (L, 2L - 1) relative logits, got ({n}, {width})")
    if n == 1:
        return rel_logits
    flat = rel_logits.reshape(*lead, n * width)[..., n - 1: n - 1 + n * (2 * n - 2)]
    return flat.reshape(*lead, n, 2 * n - 2)[..., :n]


def music_relative_attention(q: Tensor, k: Tensor, v: Tensor, rel_keys: Tensor, *, causal: bool,
                             key_padding_mask: Tensor | None = None) -> Tensor:
    """Relative softmax attention of Music Transformer, via skewing; O(L·D) extra memory.

    Args:
        q: (B, L, H, D) queries.
        k: (B, L, H, D) keys.
        v: (B, L, H, Dv) values.
        rel_keys: relative embeddings e_r per head, by increasing r: causal (L, H, D) for
            r = −(L−1) … 0; non-causal (2L − 1, H, D) for r = −(L−1) … L − 1.
        causal: mask keys after each query.
        key_padding_mask: (B, L) bool, True at padding keys (no weight).

    Returns:
        (B, L, H, Dv).

    Raises:
        ValueError: on shapes that do not match.
    """
    check_pair(q, k, v)
    n, d = q.shape[1], q.shape[-1]
    if k.shape[1] != n:
        raise ValueError(f"skewed relative attention needs as many keys as queries, got {k.shape[1]} and {n}")
    width = n if causal else 2 * n - 1
    if rel_keys.shape != (width, q.shape[2], d):
        raise ValueError(f"rel_keys must be ({width}, {q.shape[2]}, {d}) for length {n} "
                         f"({'causal' if causal else 'non-causal'}), got {tuple(rel_keys.shape)}")
    qh = q.transpose(1, 2)  # (B, H, L, D)
    rel = torch.einsum("bhid,rhd->bhir", qh, rel_keys)  # (B, H, L, width)
    bias = (skew(rel) if causal else relative_shift(rel)) * d**-0.5
    if causal:
        future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        bias = bias.masked_fill(future, float("-inf"))
    bias = mask_padding(bias, key_padding_mask)
    out = F.scaled_dot_product_attention(qh, k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias)
    return out.transpose(1, 2)


def shaw_attention(q: Tensor, k: Tensor, v: Tensor, rel_keys: Tensor, rel_values: Tensor, *,
                   causal: bool, query_offset: int = 0, key_padding_mask: Tensor | None = None) -> Tensor:
    """Shaw et al. (2018) relative attention, explicit; O(Lq·Lk·D) memory.

    Args:
        q: (B, Lq, H, D) queries at positions query_offset … query_offset + Lq − 1.
        k: (B, Lk, H, D) keys at positions 0 … Lk − 1.
        v: (B, Lk, H, Dv) values.
        rel_keys: (Lq, Lk, D) a^K_ij, shared by the heads (eq. 3-4 of Shaw et al.).
        rel_values: (Lq, Lk, Dv) a^V_ij.
        causal: mask keys after each query.
        query_offset: position of the first query.
        key_padding_mask: (B, Lk) bool, True at padding keys (no weight).

    Returns:
        (B, Lq, H, Dv).

    Raises:
        ValueError: on shapes that do not match.
    """
    check_pair(q, k, v)
    lq, lk, d = q.shape[1], k.shape[1], q.shape[-1]
    if rel_keys.shape != (lq, lk, d) or rel_values.shape != (lq, lk, v.shape[-1]):
        raise ValueError(f"rel_keys must be ({lq}, {lk}, {d}) and rel_values ({lq}, {lk}, {v.shape[-1]}), got "
                         f"{tuple(rel_keys.shape)} and {tuple(rel_values.shape)}")
    logits = (torch.einsum("bihd,bjhd->bhij", q, k) + torch.einsum("bihd,ijd->bhij", q, rel_keys)) * d**-0.5
    if causal:
        i = torch.arange(lq, device=q.device)[:, None] + query_offset
        logits = logits.masked_fill(torch.arange(lk, device=q.device)[None] > i, float("-inf"))
    weights = mask_padding(logits, key_padding_mask).softmax(dim=-1)
    return torch.einsum("bhij,bjhe->bihe", weights, v) + torch.einsum("bhij,ije->bihe", weights, rel_values)

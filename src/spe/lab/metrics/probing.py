"""Identical word probing (Wang et al. 2021; appendix D.3 of Liutkus et al. 2021).

A sequence repeating one token has no content to tell its positions apart, so any structure
in the attention between its positions comes from the positional encoding alone. The paper
computes the unnormalised attention of each head of the first layer on such sequences and
scores it with :func:`~spe.lab.metrics.translation_invariance` and :func:`~spe.lab.metrics.monotonicity`,
averaged over all tokens of the vocabulary.

Letters: H = num_heads, L = length, E = the dimension the attention kernel sees (R with
SPE, head_dim D otherwise).
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from spe.lab.metrics.capture import layer_queries_keys

if TYPE_CHECKING:
    from spe.models.decoder_lm import DecoderLM

__all__ = ["identical_token_attention"]


def _int(name: str, value) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


@torch.no_grad()
def identical_token_attention(model: DecoderLM, token: int, length: int, *, layer: int = 0) -> Tensor:
    """Unnormalised causal attention of one layer on a sequence repeating one token.

    The model runs in eval mode (no dropout; the SPE code drawn from ``config.code_seed``,
    as at test time) on ``[token] * length`` at positions 0 … L−1; a forward pre-hook takes
    the input that the chosen layer's attention actually receives (after everything that
    precedes it: embedding, APE, earlier layers, the pre-norm) together with the SPE code,
    and the layer's own projection (and SPE filter) turns it into queries and keys q, k of
    shape (1, L, H, E). Then, per head, in float64::

        A[h, m, n] = exp(q_m · k_n / √E − c_h)   for n <= m,   0 for n > m (causal mask),

    which is the paper's A = exp(Q K^T / √D) for APE/no PE and exp(Q^ K^^T / √R) for SPE
    (the filter already carries SPE's 1/(D·R)^{1/4} scale), the kernel a Performer
    approximates; with RoPE (softmax attention only) q and k are rotated first, as the layer
    does. Encodings that add a term to the scores (Shaw, music-relative …) are refused.

    c_h is the largest causal logit of head h: a constant factor exp(−c_h) on the whole
    matrix, which keeps the entries in (0, 1] and leaves both metrics unchanged (they are
    scale-free). A row-wise maximum would not be a constant and would change the matrix, so
    it is not used.

    The model's train/eval mode is restored afterwards. Memory is H·L²·8 bytes for the result.

    Args:
        model: a :class:`~spe.models.DecoderLM`.
        token: the repeated token id, in [0, vocab_size).
        length: L, the number of positions.
        layer: index of the block whose attention is probed (0 = first layer, as in Table 7).

    Returns:
        (H, L, L) float64 tensor on the CPU; [h, m, n] is query m attending to key n.

    Raises:
        ValueError: on a token out of range, a non-positive length, a layer that does not exist,
            a score-term positional encoding, or RoPE with a linear kernel.
        TypeError: if ``model`` has no ``blocks`` of attention layers (not a DecoderLM).
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None or not hasattr(model, "config"):
        raise TypeError(f"model must be a spe.models.DecoderLM, got {type(model).__name__}")
    token, length, layer = _int("token", token), _int("length", length), _int("layer", layer)
    vocab_size = model.config.vocab_size
    if not 0 <= token < vocab_size:
        raise ValueError(f"token must lie in [0, {vocab_size}), got {token}")
    if length < 1:
        raise ValueError(f"length must be a positive integer, got {length}")
    if not 0 <= layer < len(blocks):
        raise ValueError(f"layer must lie in [0, {len(blocks)}) for this {len(blocks)}-layer model, "
                         f"got {layer}")

    attn = blocks[layer].attn
    if getattr(attn, "score_encoding", None) is not None:
        raise ValueError(f"{type(attn.score_encoding).__name__} adds a term to the attention scores, "
                         "which this probe does not reconstruct; it supports encodings added to tokens "
                         "(ape, ape-learned), sinespe, convspe, rope (softmax) and none")
    # The shared capture runs the model in eval mode, takes the layer's input with a pre-hook and
    # forms q, k with the layer's own projection (and SPE filter, or RoPE rotation), so the probe
    # follows any change in how queries and keys are formed; it refuses RoPE with a linear kernel.
    device = next(model.parameters()).device
    q, k = layer_queries_keys(model, torch.full((1, length), token, dtype=torch.long, device=device),
                              layer=layer)  # (1, L, H, E)
    q, k = q[0].to("cpu", torch.float64), k[0].to("cpu", torch.float64)  # (L, H, E)
    logits = torch.einsum("mhe,nhe->hmn", q, k) / math.sqrt(q.shape[-1])  # (H, L, L)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    logits = logits.masked_fill(~causal, -math.inf)
    logits = logits - logits.amax(dim=(1, 2), keepdim=True)
    return torch.exp(logits)  # exp(−inf) = 0 above the diagonal

"""Reading a layer's queries, keys and attention matrix offline (appendix D.1 of Liutkus et al. 2021).

Linear-attention models never form the L × L attention matrix, but it can be computed
offline from the queries and keys the kernel sees: "A = exp(Q K^T / √D) (APE), or
A = exp(Q^ K^^T / √R) (SPEs); then apply row-wise softmax operation on A as normalization"
(appendix D.1, Figures 8-12). A forward pre-hook on the layer's attention captures its input;
:func:`layer_queries_keys` forms the queries and keys from it with the layer's own projection,
and :func:`attention_matrices` asks the layer for that softmax attention
(:meth:`~spe.attention.MultiHeadAttention.attention_weights` with ``exact=True``).

Letters: B = batch, L = length, H = num_heads, D = head_dim, E = the dimension the attention
kernel sees (R with SPE, D otherwise), W = relative positions of a score encoding.
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor

from spe.models.decoder_lm import DecoderLM

__all__ = ["attention_matrices", "layer_index", "layer_queries_keys"]


def _blocks(model):
    if not isinstance(model, DecoderLM):
        raise TypeError(f"model must be a spe.models.DecoderLM, got {type(model).__name__}")
    return model.blocks


def layer_index(layer, num_layers: int) -> int:
    """A layer number in [0, num_layers), counting negative ones from the end (Python style).

    Raises:
        TypeError: if ``layer`` is not an integer.
        ValueError: if it lies outside [-num_layers, num_layers).
    """
    try:
        layer = operator.index(layer)
    except TypeError:
        raise TypeError(f"layer must be an integer, got {layer!r}") from None
    if not -num_layers <= layer < num_layers:
        raise ValueError(f"layer must lie in [0, {num_layers}) (or [-{num_layers}, -1] from the end) for this "
                         f"{num_layers}-layer model, got {layer}")
    return layer % num_layers


@torch.no_grad()
def layer_queries_keys(model: DecoderLM, tokens: Tensor, *, layer: int = 0) -> tuple[Tensor, Tensor]:
    """Queries and keys exactly as one layer's attention kernel receives them.

    The model runs once in eval mode (no dropout; the SPE code drawn from
    ``config.code_seed``, as at test time) on ``tokens`` at positions 0 … L−1. A forward
    pre-hook takes the input that the layer's attention receives (after the embedding, APE,
    earlier layers and the pre-norm) with the SPE code and the RoPE positions, and the layer's
    own :meth:`~spe.attention.MultiHeadAttention.project` (projection and SPE filter) forms q and k, so this follows any change in
    how the layer builds them. With softmax RoPE, q and k are then rotated as ``forward``
    does. The model's train/eval mode is restored afterwards.

    Args:
        model: a :class:`~spe.models.DecoderLM`.
        tokens: (B, L) token ids in [0, vocab_size).
        layer: block index, 0-based; negative counts from the last block (−1 = last).

    Returns:
        q, k of shape (B, L, H, E), on the model's device and dtype. With SPE they carry the
        filter's 1/(D·R)^{1/4} scale, so q·k / √E is the exponent of the kernel.

    Raises:
        TypeError: if ``model`` is not a DecoderLM or ``layer`` is not an integer.
        ValueError: if the layer does not exist, or for RoPE with a linear kernel (which
            rotates kernel features, not queries and keys) or a feature transform (PermuteFormer …).
    """
    attn, captured = _capture(model, tokens, layer)
    q, k, _ = attn.project(captured["x"], captured["code"], times=captured["times"])  # (B, L, H, E)
    if attn.rotary is not None:  # softmax RoPE rotates q and k after the projection, as forward does
        positions = captured["positions"]
        if positions is None:
            positions = torch.arange(q.shape[1], device=q.device)
        # at the times the layer reads: its positions, or a learned clock's (spe.encodings.clock)
        times, _ = attn.rotary.prepare(captured["x"], positions)
        q, k = attn.rotary.transform_features(q, times), attn.rotary.transform_features(k, times)
    return q, k


@torch.no_grad()
def _capture(model: DecoderLM, tokens: Tensor, layer: int):
    """(the layer's attention, {"x", "code", "positions"} of its call) in one eval-mode forward.

    Raises:
        ValueError: on a layer that does not exist, or one whose positional encoding acts on the
            kernel features (RoPE with a linear kernel, a feature transform).
    """
    blocks = _blocks(model)
    layer = layer_index(layer, len(blocks))
    attn = blocks[layer].attn
    if attn.rotary is not None and attn.kernel.feature_map is not None:
        raise ValueError(f"with {attn.attention} attention RoPE rotates the kernel features, not the queries "
                         "and keys, so q·k/√D is not what the model computes; only softmax RoPE models can "
                         "be read this way")
    if getattr(attn, "feature_transform", None) is not None:
        raise ValueError(f"{attn.feature_transform.label} transforms the kernel features, not the queries and keys, "
                         "so q·k/√D is not what the model computes")
    captured: dict = {}

    def grab(module, args, kwargs):
        captured["x"] = args[0] if args else kwargs["x"]
        captured["code"] = args[1] if len(args) > 1 else kwargs.get("code")
        captured["positions"] = kwargs.get("positions")
        captured["times"] = kwargs.get("times")  # the onset clock's

    was_training = model.training
    handle = attn.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        model.eval()
        model(tokens.to(next(model.parameters()).device))
    finally:
        handle.remove()
        model.train(was_training)
    if "x" not in captured:
        raise RuntimeError(f"layer {layer}'s attention was not called by the model's forward")
    return attn, captured


@torch.no_grad()
def attention_matrices(model: DecoderLM, tokens, *, layer: int = 0) -> Tensor:
    """Softmax-normalised causal attention of one layer, computed offline (Figures 8-12).

    Per head h, in float64::

        A[h, m, n] = softmax_n(q_m · k_n / √E + s_h(m, n)) over n <= m,   0 for n > m,

    with q, k as :func:`layer_queries_keys` forms them (after the SPE filter: E = R; or RoPE:
    rotated), and s what the layer adds to the logits: the score encoding's term (a bias;
    Shaw's and Music Transformer's q·e_{n−m} / √D; the SPE oracle's scores), a decay's or
    gate's log weight (FoX), and −∞ beyond a sliding window. This is
    :meth:`~spe.attention.MultiHeadAttention.attention_weights` with ``exact=True``: for
    softmax models the attention the layer computes; for linear kernels the softmax attention
    that the kernel stands for (the paper's offline A = exp(Q^ K^^T / √R), row-normalised): a
    Performer approximates it with random features, and ReLU/ELU kernels replace it by
    another similarity.

    Args:
        model: a :class:`~spe.models.DecoderLM`.
        tokens: (L,) or (1, L) token ids (tensor or sequence of ints), L >= 1.
        layer: block index, 0-based; negative counts from the end.

    Returns:
        (H, L, L) float64 tensor on the CPU; [h, m, n] is query m attending to key n, each
        row sums to 1 and entries above the diagonal are 0. Memory: about 3·H·L²·8 bytes.

    Raises:
        ValueError: on tokens that are not one sequence of ids in range, a layer that does not
            exist, RoPE with a linear kernel or a feature transform, or a gate per feature
            channel (``gated-channel``, no term of the logits).
        TypeError: if ``model`` is not a DecoderLM.
    """
    _blocks(model)
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    if tokens.dim() == 1:
        tokens = tokens[None]
    if tokens.dim() != 2 or tokens.shape[0] != 1 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be one non-empty sequence of shape (L,) or (1, L), got shape "
                         f"{tuple(tokens.shape)}")
    attn, captured = _capture(model, tokens, layer)
    weights = attn.attention_weights(captured["x"], captured["code"], positions=captured["positions"], exact=True,
                                     dtype=torch.float64, times=captured["times"])  # (1, H, L, L)
    return weights[0].cpu()

"""PaTH: position encoding by accumulating Householder-like transformations (Yang et al. 2025).

Letters: B = batch, L = length, C = d_model, H = num_heads, D = head_dim, K = the width of the
short convolution of w.

Each layer makes, from its input x_t (the block's normalised hidden state, the one q, k, v
are projected from), a direction and a strength per head::

    w_t = normalize(SiLU(conv_K(W_w x_t)))  per head (D),   β_t = 2·sigmoid(W_β x_t + b_β) ∈ (0, 2)

and softmax attention's logits become q_mᵀ (H_m ⋯ H_{n+1}) k_n / √D with H_t = I − β_t w_t w_tᵀ
(:func:`~spe.ops.path_attention`): position enters through the data between key and query,
not through the index. With ``--decay gated`` the layer's forget gate (FoX's) adds
F_m − F_n: PaTH-FoX.

As fla's ``layers/path_attn.py`` (its defaults): W_w is low rank, C → 32 → C (fla: "to reduce
parameters in MHA settings"), followed by a causal short convolution of width 3 with SiLU
(fla's ``use_w_shortconv=True``), then the L2 norm per head; W_β has a bias. Decoding carries
the transformed keys (:class:`PathCache`) and the convolution's last K − 1 inputs.

Softmax only, causal only: it acts in the scores (the registry's ``scores`` place), so linear
kernels refuse it by the placement rule. The layer hands it its input x and its gate through
:meth:`PathEncoding.for_input`; what it needs from the layer, for the encodings' protocol:

* parallel forward: x (B, L, C) and the gate (B, L, H) or None, then q, k, v (B, L, H, D);
* decoding: the same for one position, and its own state (:class:`PathCache`, a
  :class:`~spe.ops.KVCache` of transformed keys plus the convolution's inputs) in place of the
  kernel's KV cache: the step multiplies every cached key by H_t;
* prefill from the start: the state after L positions.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spe.encodings.short_conv import ShortConvolution
from spe.encodings.spec import PositionalSpec, ScoreEncoding
from spe.ops.path import path_attention, path_attention_step, path_logits, path_prefill_cache
from spe.ops.path.flash import FLASH_MIN_LENGTH
from spe.ops.common.state import KVCache

__all__ = ["PATH_CONV_SIZE", "PATH_W_RANK", "PathCache", "PathEncoding", "PathTerm", "SPEC"]

PATH_W_RANK = 32  # fla's low-rank W_w
PATH_CONV_SIZE = 3  # fla's conv_size


@dataclass(frozen=True, kw_only=True)
class PathCache(KVCache):
    """A PaTH layer's decoding state: a :class:`~spe.ops.KVCache` whose keys are carried to the
    newest position (k̃_n = H_{t−1} ⋯ H_{n+1} k_n), and ``w_cache`` (B, K − 1, C), the last K − 1
    inputs of the short convolution of w."""

    w_cache: Tensor | None = None


class PathEncoding(ScoreEncoding):
    """One layer's PaTH parameters: W_w (low rank), the convolution of w, W_β.

    Args:
        d_model: C.
        num_heads: H.
        causal: must be True (PaTH's products run from key to query in order).

    Raises:
        ValueError: for ``causal=False`` or d_model not divisible by num_heads.
    """

    label = "PaTH"
    takes_gate = True  # FoX's gate enters its logits (PaTH-FoX): the layer hands it over
    # its logits depend on the tokens between key and query, which block-local attention's windows cut
    distance_only = False

    def __init__(self, d_model: int, num_heads: int, *, causal: bool = True) -> None:
        super().__init__()
        if not causal:
            raise ValueError("positional 'path' is causal (its Householder products run from each key to its "
                             "query): it has no encoder (non-causal) form")
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.causal, self.num_heads = True, num_heads
        self.w_proj = nn.Sequential(nn.Linear(d_model, PATH_W_RANK, bias=False),
                                    nn.Linear(PATH_W_RANK, d_model, bias=False))
        self.w_conv = ShortConvolution(d_model, PATH_CONV_SIZE, causal=True)
        self.beta_proj = nn.Linear(d_model, num_heads)

    def directions(self, x: Tensor, cache: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """w (B, L, H, D) of unit norm and β (B, L, H), in at least float32, from the layer's
        input x (B, L, C) going on from the convolution's ``cache`` (None: the start); and the
        convolution's new cache (B, K − 1, C)."""
        w, cache = self.w_conv(self.w_proj(x), cache)
        w = F.normalize(w.float().unflatten(-1, (self.num_heads, -1)), dim=-1)
        beta = 2 * torch.sigmoid(self.beta_proj(x).float())
        return w, beta, cache

    def decoding_state(self, cache: KVCache) -> PathCache:
        """A :class:`PathCache` from a KV cache whose keys are taken as already carried to its newest
        position, with a zero convolution memory (the start of a sequence's; e.g. a benchmark's state)."""
        conv = cache.keys.new_zeros(cache.keys.shape[0], PATH_CONV_SIZE - 1, self.w_conv.weight.shape[0])
        return _with_conv(cache, conv)

    def for_input(self, x: Tensor, log_decay: Tensor | None = None) -> PathTerm:
        """The layer's score term for this call: PaTH attention with the directions of x
        (B, L, C) and the layer's gate (B, L, H) or None."""
        return PathTerm(self, x, log_decay)

    def forward(self, *args, **kwargs):
        """Refused: PaTH replaces attention and reads the layer's input (:meth:`for_input`).

        Raises:
            ValueError: always, naming the calls to make instead.
        """
        raise ValueError("PathEncoding is not applied to queries and keys: it forms attention from the layer's "
                         "input x (batch, length, d_model): term = enc.for_input(x), then term.attend(q, k, v) "
                         "(term.step, term.prefill to decode), as spe.MultiHeadAttention does")

    def prepare(self, x: Tensor, positions: Tensor | None, state=None, *,
                key_padding_mask: Tensor | None = None) -> tuple[Tensor, None]:
        """The layer's protocol (:class:`~spe.encodings.spec.LayerEncoding`): the call's context is
        its input x, from which :meth:`score_term` makes the directions; the decoding state is the
        term's own cache (:class:`PathCache`, in the kernel's place)."""
        return x, None

    def score_term(self, context: Tensor, log_decay: Tensor | None = None) -> PathTerm:
        return self.for_input(context, log_decay)


class PathTerm:
    """PaTH attention for one call of a layer (its input and gate bound): the softmax kernel's
    score term, with its own decoding state. q, k, v as the kernel receives them (B, L, H, D)."""

    def __init__(self, encoding: PathEncoding, x: Tensor, log_decay: Tensor | None) -> None:
        self.encoding, self.x, self.log_decay = encoding, x, log_decay

    def _check_from_start(self, q: Tensor, k: Tensor, query_offset: int) -> None:
        if query_offset or q.shape[1] != k.shape[1] or k.shape[1] != self.x.shape[1]:
            raise ValueError(f"PaTH's parallel form runs from position 0 over the layer's own "
                             f"{self.x.shape[1]} positions (query offset {query_offset}, {k.shape[1]} keys): "
                             f"decode with step")

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, query_offset: int = 0,
               key_padding_mask: Tensor | None = None) -> Tensor:
        """Causal PaTH attention (B, L, H, D) of the call's L positions from position 0.

        Raises:
            ValueError: for a query offset, keys of another length or a padding mask.
        """
        if key_padding_mask is not None:
            raise ValueError("PaTH is causal: it takes no key padding mask")
        self._check_from_start(q, k, query_offset)
        w, beta, _ = self.encoding.directions(self.x)
        return path_attention(q, k, v, w, beta, log_decay=self.log_decay)

    def weights(self, q: Tensor, k: Tensor, *, key_padding_mask: Tensor | None = None) -> Tensor:
        """(B, H, L, L) attention weights of :meth:`attend` (0 after each query), in q's dtype."""
        if key_padding_mask is not None:
            raise ValueError("PaTH is causal: it takes no key padding mask")
        self._check_from_start(q, k, 0)
        w, beta, _ = self.encoding.directions(self.x)
        n = q.shape[1]
        scores = path_logits(q, k, w.to(q.dtype), beta.to(q.dtype)) / q.shape[-1] ** 0.5
        if self.log_decay is not None:
            f = self.log_decay.to(q.dtype).cumsum(1).transpose(1, 2)  # (B, H, L)
            scores = scores + f[..., :, None] - f[..., None, :]
        future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        return scores.masked_fill(future, -torch.inf).softmax(-1)

    def step(self, q: Tensor, k: Tensor, v: Tensor, state: KVCache | None) -> tuple[Tensor, PathCache]:
        """One decoding position (q, k, v (B, 1, H, D)) from ``state`` (None at position 0).

        Raises:
            TypeError: for a KV cache that is not a :class:`PathCache` (its keys untransformed).
        """
        if state is not None and not isinstance(state, PathCache):
            raise TypeError(f"a PaTH layer decodes with a PathCache (keys carried through H_t), got "
                            f"{type(state).__name__}")
        w, beta, conv = self.encoding.directions(self.x, None if state is None else state.w_cache)
        y, cache = path_attention_step(q, k, v, w, beta, state, log_decay=self.log_decay)
        return y, _with_conv(cache, conv)

    def prefill(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, PathCache]:
        """:meth:`attend`'s output and the state after these positions (from position 0)."""
        self._check_from_start(q, k, 0)
        w, beta, conv = self.encoding.directions(self.x)
        y = path_attention(q, k, v, w, beta, log_decay=self.log_decay)
        return y, _with_conv(path_prefill_cache(k, v, w, beta, log_decay=self.log_decay), conv)


def _with_conv(cache: KVCache, conv: Tensor) -> PathCache:
    return PathCache(**{f.name: getattr(cache, f.name) for f in fields(KVCache)}, w_cache=conv)


SPEC = PositionalSpec("path", "scores", takes_gate=True, causal_only=True, score_bytes=10.0,
                      linear_from=FLASH_MIN_LENGTH,
                      source="Yang et al. 2025 (PaTH), fla layers/path_attn.py; softmax only, O(L²D) time",
                      layer_module=lambda c, causal: PathEncoding(c.d_model, c.num_heads, causal=causal))

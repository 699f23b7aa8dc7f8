"""Multi-head attention layer: projections, the queries/keys positional hook, a kernel.

Letters: B = batch, L = length, C = d_model, H = num_heads, D = head_dim,
R = num_realizations, M = num_features.

SPE sits between the query/key projections and the feature map (Algorithm 1 of Liutkus
et al. 2021): q, k -> (SPEFilter) -> q̂, k̂ of size R -> φ -> linear attention.

Where a positional encoding acts decides which kernels accept it (``ACCEPTS``): codes and
rotations of queries and keys work with every kernel; a term in the attention scores
(Shaw, Music Transformer, ALiBi) needs the explicit scores of softmax attention.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from spe.encodings.code import SPECode
from spe.encodings.filter import SPEFilter
from spe.encodings.registry import positional_names
from spe.encodings.rope import RotaryEncoding
from spe.ops.feature_maps import (
    elu_feature_map,
    favor_feature_map,
    favor_key_features,
    orthogonal_random_features,
    relu_feature_map,
)
from spe.ops.linear import causal_linear_attention, kernel_dtype, linear_attention
from spe.ops.recurrent import append_to_cache, linear_attention_step, softmax_attention_step
from spe.ops.softmax import check_window, softmax_attention
from spe.ops.state import KVCache, LinearAttentionState, check_state_window

__all__ = ["ACCEPTS", "ATTENTIONS", "MultiHeadAttention"]

ATTENTIONS = ("softmax", "performer", "linear-relu", "linear-elu")
# Where a positional encoding may act, per kernel: "tokens" (added to embeddings),
# "queries-keys" (SPE codes, rotations), "scores" (a term added to q·k before the softmax).
ACCEPTS = {"softmax": ("tokens", "queries-keys", "scores"), "performer": ("tokens", "queries-keys"),
           "linear-relu": ("tokens", "queries-keys"), "linear-elu": ("tokens", "queries-keys")}
_FEATURE_MAPS = {"linear-relu": relu_feature_map, "linear-elu": elu_feature_map}


class MultiHeadAttention(nn.Module):
    """Self-attention with a pluggable kernel and an optional SPE filter.

    Args:
        d_model: C.
        num_heads: H.
        attention: one of ``ATTENTIONS``: ``softmax`` (exact, O(L²)), ``performer`` (FAVOR+
            positive orthogonal random features), ``linear-relu``, ``linear-elu``.
        causal: mask the future.
        spe_filter: applies an SPE code to queries and keys (then the kernel sees dimension R).
        num_realizations: R, required with ``spe_filter`` for the performer projection size.
        num_features: M, random features for ``performer``.
        chunk_size: chunk length of causal linear attention.
        rotary: RoPE; rotates queries and keys (softmax) or their features (linear kernels,
            RoFormer eq. (19): rotated numerator, unrotated normaliser).
        score_encoding: a relative term in the scores (``ShawRelativePosition``,
            ``MusicRelativePosition``, ``ALiBi``): any module with
            ``attend(q, k, v, *, query_offset) -> y`` and ``score_bias(q, num_keys, *,
            query_offset) -> (B, H, Lq, Lk)`` (the term it adds to q·k/√D, read by
            :mod:`spe.metrics.capture`); softmax attention only.
        window: W, causal sliding-window attention: position m attends to n ∈ (m − W, m]
            only, in :meth:`forward` and :meth:`step` alike (decoding then keeps the last W
            keys, so memory stays O(W)). None: the whole past. Settable later
            (``layer.window = W``), e.g. at test time; not with a score encoding.

    Raises:
        ValueError: on an unknown attention name, d_model not divisible by num_heads, a
            score encoding with a linear kernel, two positional encodings at once, RoPE
            on an odd feature dimension, or a window that is not positive, not causal or
            combined with a score encoding.
    """

    def __init__(self, d_model: int, num_heads: int, *, attention: str = "performer",
                 causal: bool = True, spe_filter: SPEFilter | None = None,
                 num_realizations: int | None = None, num_features: int = 64,
                 chunk_size: int = 64, rotary: RotaryEncoding | None = None,
                 score_encoding: nn.Module | None = None, window: int | None = None) -> None:
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r}; choose one of {', '.join(ATTENTIONS)}")
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.attention, self.causal, self.chunk_size = attention, causal, chunk_size
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.spe_filter = spe_filter
        self.kernel_dim = num_realizations if spe_filter is not None else self.head_dim
        if attention == "performer":
            if self.kernel_dim is None:
                raise ValueError("performer attention with SPE needs num_realizations")
            self.num_features = num_features
            self.register_buffer("projection", orthogonal_random_features(num_heads, num_features,
                                                                          self.kernel_dim))
        if sum(m is not None for m in (spe_filter, rotary, score_encoding)) > 1:
            raise ValueError("an attention layer takes one positional encoding: an SPE filter, a rotary "
                             "encoding or a score encoding")
        if score_encoding is not None and "scores" not in ACCEPTS[attention]:
            raise ValueError(f"{type(score_encoding).__name__} adds a term to the attention scores, which "
                             f"{attention} attention never forms; use softmax attention, or a positional "
                             f"encoding that acts on tokens or queries/keys "
                             f"({', '.join(positional_names(acts_on='tokens') + positional_names(acts_on='queries-keys'))})")
        if score_encoding is not None and getattr(score_encoding, "causal", causal) != causal:
            raise ValueError(f"the score encoding is {'' if score_encoding.causal else 'non-'}causal but the layer "
                             f"is {'' if causal else 'non-'}causal")
        if rotary is not None and attention == "linear-relu":
            # ReLU features can make the unrotated normaliser exactly 0 while the rotated
            # numerator is not (RoFormer eq. 19 needs strictly positive features).
            raise ValueError("rotary encoding with linear attention needs strictly positive features: use "
                             "performer or linear-elu, not linear-relu")
        rotated_dim = num_features if attention == "performer" else self.head_dim
        if rotary is not None and rotated_dim % 2:
            raise ValueError(f"rotary encoding needs an even {'num_features' if attention == 'performer' else 'head_dim'}"
                             f", got {rotated_dim}")
        self.rotary, self.score_encoding = rotary, score_encoding
        self.window = window

    @property
    def window(self) -> int | None:
        """W of sliding-window attention (None: the whole past)."""
        return self._window

    @window.setter
    def window(self, value: int | None) -> None:
        if value is not None:
            check_window(value, "attention window")
            if not self.causal:
                raise ValueError("an attention window needs a causal layer")
            if self.score_encoding is not None:
                raise ValueError(f"an attention window cannot be combined with "
                                 f"{type(self.score_encoding).__name__}, which forms its own scores")
        self._window = value

    @torch.no_grad()
    def redraw_features(self, generator: torch.Generator | None = None) -> None:
        """Draws new FAVOR+ projections (no-op for other kernels)."""
        if self.attention == "performer":
            self.projection.copy_(orthogonal_random_features(
                self.num_heads, self.num_features, self.kernel_dim, generator=generator))

    def project(self, x: Tensor, code: SPECode | None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values as the kernel receives them (before RoPE and feature maps).

        Args:
            x: (B, L, C) the layer's input.
            code: the SPE code for these L positions (required iff the layer has an SPE filter).

        Returns:
            q, k of shape (B, L, H, E) (E = R with SPE, carrying the filter's 1/(D·R)^{1/4}
            scale; E = D otherwise) and v of shape (B, L, H, D).
        """
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).unbind(2)  # (B, L, H, D)
        if self.spe_filter is not None:
            if code is None:
                raise ValueError("this attention layer uses SPE: pass the code drawn for this forward")
            q, k = self.spe_filter(q, k, code)  # (B, L, H, R)
        return q, k, v

    def _projection_for(self, dim: int) -> Tensor:
        if dim == self.projection.shape[-1]:
            return self.projection
        # A test-time R differs from the trained one: FAVOR+ needs projections of the new size;
        # draw them from a fixed seed so that the same input still gives the same output.
        generator = torch.Generator().manual_seed(dim)
        return orthogonal_random_features(self.num_heads, self.num_features, dim,
                                          generator=generator).to(self.projection)

    def _features(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, dict]:
        if self.attention == "performer":  # key features with their scale apart (no clamp, no overflow)
            projection = self._projection_for(q.shape[-1])
            fk, log_scale = favor_key_features(k, projection)
            return favor_feature_map(q, projection, is_query=True), fk, {"key_log_scale": log_scale}
        fmap = _FEATURE_MAPS[self.attention]
        return fmap(q), fmap(k), {}

    def _linear_inputs(self, q: Tensor, k: Tensor, positions: Tensor | None) -> tuple[Tensor, Tensor, dict]:
        """Feature maps (and FAVOR+ key scales), and RoFormer eq. (19) with RoPE: rotated
        features for the numerator, the positive unrotated ones as a separate normaliser."""
        fq, fk, extra = self._features(q, k)
        if self.rotary is None:
            return fq, fk, extra
        # rotate in at least float32 (bf16 cos/sin are coarse), as the kernels then compute
        dtype = kernel_dtype(fq)
        fq, fk = fq.to(dtype), fk.to(dtype)
        return self.rotary(fq, positions), self.rotary(fk, positions), {**extra, "normalizer": (fq, fk)}

    def step(self, x: Tensor, code: SPECode | None,
             state: KVCache | LinearAttentionState | None) -> tuple[Tensor, KVCache | LinearAttentionState]:
        """One causal decoding step with an explicit state; equals :meth:`forward` position by position.

        The kernels' recurrent twins do the work (:mod:`spe.ops.recurrent`): linear kernels keep
        a :class:`~spe.ops.LinearAttentionState` (S = Σ φ(k̂_n) v_nᵀ and z = Σ φ(k̂_n), so every
        step costs the same; with a window the last W keys and values instead), softmax keeps a
        :class:`~spe.ops.KVCache`. States count the positions seen (RoPE and score encodings
        need the index of the new one) and record their window.

        Args:
            x: (B, 1, C) the new position's input.
            code: SPE code for this single position (queries and keys).
            state: the previous step's state, or None at position 0.

        Returns:
            (B, 1, C) output and the new state.

        Raises:
            ValueError: on a state built with another window.
            TypeError: on a state of the wrong kind for this kernel.
        """
        kind = KVCache if self.attention == "softmax" else LinearAttentionState
        if isinstance(state, dict):
            state = legacy_state(state, kind, scaled=self.attention == "performer")
        if state is not None and not isinstance(state, kind):
            raise TypeError(f"{self.attention} attention decodes with a {kind.__name__}, got {type(state).__name__}")
        check_state_window(state, self.window)
        q, k, v = self.project(x, code)
        position = 0 if state is None else state.position
        pos = torch.tensor([position], device=x.device)
        if self.attention != "softmax":
            fq, fk, extra = self._linear_inputs(q, k, pos)
            y, state = linear_attention_step(fq, fk, v, state, window=self.window, **extra)
        elif self.score_encoding is not None:
            state = append_to_cache(state, k, v, window=self.window)
            y = self.score_encoding.attend(q, state.keys, state.values, query_offset=position)
        else:
            if self.rotary is not None:
                q, k = self.rotary(q.to(kernel_dtype(q)), pos), self.rotary(k.to(kernel_dtype(k)), pos)
            y, state = softmax_attention_step(q, k, v, state, window=self.window)
        return self.out(y.reshape(x.shape[0], 1, -1)), state

    def forward(self, x: Tensor, code: SPECode | None = None, *, positions: Tensor | None = None) -> Tensor:
        """Args:
            x: (B, L, C).
            code: SPE code for L positions; required iff the layer has an SPE filter.
            positions: (L,) positions for RoPE (default 0 … L − 1); score encodings use
                index distances and refuse them.

        Returns:
            (B, L, C).
        """
        b, n, _ = x.shape
        if positions is not None and self.score_encoding is not None:
            raise ValueError(f"{type(self.score_encoding).__name__} works on index distances; it takes no positions")
        q, k, v = self.project(x, code)
        if self.rotary is not None and positions is None:
            positions = torch.arange(n, device=x.device)
        if self.attention == "softmax":
            if self.rotary is not None:  # in at least float32, as for linear kernels
                q, k = self.rotary(q.to(kernel_dtype(q)), positions), self.rotary(k.to(kernel_dtype(k)), positions)
            if self.score_encoding is not None:
                y = self.score_encoding.attend(q, k, v)
            else:
                y = softmax_attention(q, k, v, causal=self.causal, window=self.window)
        else:
            fq, fk, extra = self._linear_inputs(q, k, positions)
            if self.causal:
                y = causal_linear_attention(fq, fk, v, chunk_size=self.chunk_size, window=self.window, **extra)
            else:
                y = linear_attention(fq, fk, v, **extra)
        return self.out(y.reshape(b, n, -1))



def legacy_state(state: dict, kind: type, *, scaled: bool = False) -> KVCache | LinearAttentionState:
    """Converts the string-keyed state dicts of earlier versions (``keys``/``values``; ``s`` with a
    trailing normaliser column, or ``s`` and ``z``; ``recent_keys``/``recent_values``) to the typed
    states, with a DeprecationWarning. ``scaled``: the kernel now carries FAVOR+ key scales, and
    the old sums were in absolute scale (log scale 0).

    Raises:
        ValueError: if the dict does not say its ``position``.
    """
    warnings.warn("decoding states are typed now (spe.ops.KVCache, spe.ops.LinearAttentionState); "
                  "string-keyed dicts will stop working", DeprecationWarning, stacklevel=3)
    if "position" not in state:
        raise ValueError("a decoding state given as a dict must carry its 'position' (the next position's index)")
    common = {"position": state["position"], "window": state.get("window")}
    if kind is KVCache:
        return KVCache(keys=state["keys"], values=state["values"], **common)
    if "recent_keys" in state:
        keys = state["recent_keys"]
        zeros = keys.new_zeros(keys.shape[:3]) if scaled else None
        return LinearAttentionState(recent_keys=keys, recent_values=state["recent_values"], recent_log_scales=zeros,
                                    log_scale=None if zeros is None else zeros[:, -1], **common)
    kv, z = (state["s"], state["z"]) if "z" in state else (state["s"][..., :-1], state["s"][..., -1])
    return LinearAttentionState(kv=kv, normalizer=z, log_scale=kv.new_zeros(kv.shape[:2]) if scaled else None,
                                **common)

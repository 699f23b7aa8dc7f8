"""FoX-Pro's block: an output gate, RMS-normalised queries and keys, a data-dependent token shift
of keys and values (Lin et al. 2025, "Forgetting Transformer: softmax attention with a forget
gate", the ``pro`` configuration of their repository), for every attention kernel.

Letters: B = batch, L = length, C = d_model, H = num_heads, D = head_dim.

The layer's input x (B, L, C) (after the block's pre-norm) drives the gates; q, k, v (B, L, H, D)
are the projected queries, keys and values (after a short convolution, if any)::

    kv_shift     k'_t = α_t k_{t−1} + (1 − α_t) k_t,   α_t = sigmoid(w_hᵀ x_t) ∈ (0, 1) per head h
                 v'_t = β_t v_{t−1} + (1 − β_t) v_t,   β_t = sigmoid(u_hᵀ x_t)   (own weights, no bias)
                 k_{−1} = v_{−1} = 0 at a sequence's start, the carried ones when decoding goes on
    qk_norm      q̃ = q / √(mean_d q_d² + ε) ⊙ g^q_h,   k̃ likewise with g^k_h;  g (H, D), ones at start
    output_gate  y ← y ⊙ sigmoid(W_o x_t)   (per channel, W_o (C, C), no bias), before the output
                 projection and after the output norm

Order in the layer: projection → short convolution → shift → QK-norm → the positional
encoding (SPE filter, RoPE, a score term or a feature transform) → kernel → output norm → gate
→ output projection. FoX shifts inside its key/value projections and normalises before RoPE; we
keep both orders, and they are the ones every encoding needs:

* the shift mixes *contents* of two positions; before the encoding each position's code,
  rotation or feature transform then acts on one position's (mixed) key, so SPE's E[q̂_m·k̂_n] =
  Σ_d q_d k_d P_d(m − n) keeps its stationary kernel in m − n (shifting after the filter would
  mix the codes of positions n − 1 and n);
* the norm before the encoding normalises the content alone. After SPE's filter it would divide
  q̂_m by ‖q̂_m‖, a random quantity of position m's code, so the estimate would no longer be
  linear in the code and unbiased for a stationary kernel; after RoPE it would not change the
  norm (a rotation keeps it) but its per-channel scale g would no longer be tied to the content
  channels. Before it, SPE estimates the same kernel of normalised q and k.

FoX's repository also applies its output norm (an RMS norm per head, ε = 1e-6, one weight per
channel of each head) before the gate; this layer's ``output_norm`` (:data:`OUTPUT_NORM_EPS`
there, fla's ``linear_attn``) shares one weight vector (D,) across heads. A weight per (head,
channel) multiplies y's channels before the output projection, as the gate does, so it can be
absorbed into the projection's columns: the two are one function class.

Decoding carries the previous position's unshifted k and v (:class:`ShiftState`, O(H·D) per
layer whatever the position); the norm and the gate hold no state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spe.ops.common.state import WrappedState

__all__ = ["PRO_OPTIONS", "QK_NORM_EPS", "FoxPro", "HeadRMSNorm", "ShiftState", "check_pro_options", "pro_options",
           "token_shift"]

# The model options of FoX-Pro's block (model config fields, MultiHeadAttention keywords), all off by default.
PRO_OPTIONS = ("output_gate", "qk_norm", "kv_shift", "output_norm")
# ε of QK-norm (FoX's per-head RMS norm of queries and keys: its GroupNorm's default).
QK_NORM_EPS = 1e-5


def check_pro_options(**values) -> None:
    """FoX-Pro's options (:data:`PRO_OPTIONS`) are True or False.

    Raises:
        ValueError: naming the option and the value, for anything but a bool.
    """
    for name, value in values.items():
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false (FoX-Pro's block), got {value!r}")


def pro_options(config) -> dict[str, bool]:
    """FoX-Pro's options of a model config (any object; a missing one is False), as keywords of
    :class:`~spe.attention.MultiHeadAttention`."""
    return {name: getattr(config, name, False) for name in PRO_OPTIONS}


def token_shift(x: Tensor, alpha: Tensor, previous: Tensor | None = None, *,
                key_padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The data-dependent token shift x'_t = α_t x_{t−1} + (1 − α_t) x_t.

    Args:
        x: (B, L, H, D).
        alpha: (B, L, H) the weights α_t of the previous position, in [0, 1].
        previous: (B, H, D) x_{−1}, the position before x (decoding going on); None: zeros.
        key_padding_mask: (B, L) bool, True at padding: a padded x_{t−1} reads as zero, so padding
            never reaches a real position.

    Returns:
        x' (B, L, H, D) in x's dtype (the mixture formed in at least float32), and x's last
        position (B, H, D), unshifted: the ``previous`` of what follows.
    """
    start = x.new_zeros(x.shape[0], 1, *x.shape[2:]) if previous is None else previous[:, None].to(x.dtype)
    before = torch.cat([start, x[:, :-1]], dim=1)  # (B, L, H, D) x_{t−1}
    if key_padding_mask is not None:
        padded_before = F.pad(key_padding_mask[:, :-1], (1, 0), value=False)  # (B, L) x_{t−1} is padding
        before = before.masked_fill(padded_before[..., None, None], 0.0)
    wide = torch.promote_types(x.dtype, torch.float32)
    a = alpha.to(wide)[..., None]  # (B, L, H, 1)
    shifted = a * before.to(wide) + (1 - a) * x.to(wide)
    return shifted.to(x.dtype), x[:, -1]


class HeadRMSNorm(nn.Module):
    """RMS norm of each head's vector with a learnable scale per head and channel (FoX's QK-norm:
    a group norm with one group per head): x / √(mean_d x_d² + ε) ⊙ g_h, in at least float32.

    Args:
        num_heads: H.
        head_dim: D.
        eps: ε (:data:`QK_NORM_EPS`).
    """

    def __init__(self, num_heads: int, head_dim: int, *, eps: float = QK_NORM_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_heads, head_dim))

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, L, H, D) -> (B, L, H, D) in x's dtype."""
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = wide * torch.rsqrt(wide.square().mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.to(wide.dtype)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


@dataclass(frozen=True, kw_only=True)
class ShiftState(WrappedState):
    """Decoding state of an attention layer with ``kv_shift``: the kernel's state and the previous
    position's keys and values before the shift (after the short convolution, if any). A short
    convolution's :class:`~spe.encodings.short_conv.ShortConvState` wraps it.

    Attributes:
        inner: the attention kernel's state (:data:`spe.ops.common.state.AttentionState`).
        keys: (B, H, D) k_{p−1}, the last position's projected key.
        values: (B, H, D) v_{p−1}.

    Raises:
        ValueError: if keys and values are not (B, H, D) of one shape or ``inner`` is a ShiftState.
    """

    inner: object
    keys: Tensor
    values: Tensor

    def __post_init__(self) -> None:
        if isinstance(self.inner, ShiftState) or self.keys.dim() != 3 or self.keys.shape != self.values.shape:
            raise ValueError(f"ShiftState holds a kernel state and (B, H, D) keys and values, got "
                             f"{type(self.inner).__name__}, keys {tuple(self.keys.shape)}, values "
                             f"{tuple(self.values.shape)}")


class FoxPro(nn.Module):
    """The parts of FoX-Pro's block a layer was asked for (module docstring): ``shift`` (a
    Linear C → 2H, α's logits for keys then values), ``q_norm`` and ``k_norm``
    (:class:`HeadRMSNorm`), ``gate`` (a Linear C → C). Parts not asked for are None and hold no
    parameter.

    Args:
        d_model: C.
        num_heads: H.
        output_gate, qk_norm, kv_shift: which parts to build.
    """

    def __init__(self, d_model: int, num_heads: int, *, output_gate: bool = False, qk_norm: bool = False,
                 kv_shift: bool = False) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.shift = nn.Linear(d_model, 2 * num_heads, bias=False) if kv_shift else None
        norm = (lambda: HeadRMSNorm(num_heads, d_model // num_heads)) if qk_norm else (lambda: None)
        self.q_norm, self.k_norm = norm(), norm()
        self.gate = nn.Linear(d_model, d_model, bias=False) if output_gate else None

    def shift_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """α and β (B, L, H) of x (B, L, C), in at least float32: sigmoid of the shift's logits."""
        logits = self.shift(x)
        alpha, beta = torch.sigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32))).chunk(2, dim=-1)
        return alpha, beta

    def forward(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, previous: tuple[Tensor, Tensor] | None = None,
                key_padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor] | None]:
        """The shift of k and v, then QK-norm.

        Args:
            x: (B, L, C) the layer's input.
            q, k, v: (B, L, H, D) projected.
            previous: (k_{p−1}, v_{p−1}) (B, H, D) each, from the last call (decoding); None: zeros.
            key_padding_mask: (B, L) bool, True at padding (:func:`token_shift`).

        Returns:
            q, k, v (B, L, H, D) as the positional encoding receives them, and the new ``previous``
            (the last position's unshifted k and v; None without a shift).
        """
        if self.shift is not None:
            alpha, beta = self.shift_weights(x)
            k_prev, v_prev = (None, None) if previous is None else previous
            k, k_last = token_shift(k, alpha, k_prev, key_padding_mask=key_padding_mask)
            v, v_last = token_shift(v, beta, v_prev, key_padding_mask=key_padding_mask)
            previous = (k_last, v_last)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v, previous

    def gate_output(self, y: Tensor, x: Tensor) -> Tensor:
        """y (B, L, H, D) ⊙ sigmoid(W_o x) for x (B, L, C) (y itself without a gate)."""
        if self.gate is None:
            return y
        return y * torch.sigmoid(self.gate(x)).view(y.shape).to(y.dtype)

    def split_state(self, state) -> tuple[object, tuple[Tensor, Tensor] | None]:
        """A layer's state (the short convolution's unwrapped) as (the kernel's state, the shift's
        ``previous`` or None).

        Raises:
            TypeError: for a layer with a shift given a state that is not a :class:`ShiftState`.
        """
        if self.shift is None or state is None:
            return state, None
        if not isinstance(state, ShiftState):
            raise TypeError(f"this layer shifts keys and values (kv_shift): it decodes with a ShiftState, "
                            f"got {type(state).__name__}")
        return state.inner, (state.keys, state.values)

    def join_state(self, state, previous: tuple[Tensor, Tensor] | None):
        """The kernel's state wrapped with the shift's ``previous`` (bare without a shift)."""
        if self.shift is None:
            return state
        return ShiftState(inner=state, keys=previous[0], values=previous[1])

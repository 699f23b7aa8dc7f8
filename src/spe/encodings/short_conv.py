"""Short convolution of the projected queries, keys and values (flash-linear-attention's
``ShortConvolution``, as in GLA, Mamba2, DeltaNet and fla's other linear layers).

Letters: B = batch, L = length, C = channels (3 × d_model: queries, keys and values side by
side), K = the convolution's width.

Each channel c is filtered on its own (a depthwise convolution), then passes a SiLU::

    y_t[c] = SiLU(Σ_{j=0}^{K−1} w[c, j] · x_{t + j − K + 1}[c] (+ b[c]))        causal

so w[c, K − 1] weighs the current input and w[c, 0] the one K − 1 positions back; inputs
before position 0 are zero, or the K − 1 carried in a cache when decoding goes on. It sits
after the layer's query/key/value projection and before SPE, RoPE and the feature maps: a
small learned mixing of each position with its K − 1 predecessors, the local, data-independent
positional signal that recurrent linear layers carry instead of (or beside) a positional
encoding. Decoding keeps the last K − 1 projected inputs (:class:`ShortConvState`), O(K·C)
memory whatever the position.

Encoders (non-causal layers) take a centred form: the window t − ⌊(K − 1)/2⌋ … t + ⌈(K − 1)/2⌉,
PyTorch's ``padding="same"`` (for an even K one more position after t than before).

It lives with the positional encodings because it is one (fla's layers have no other), and
so the parameter-group rule that keeps positional parameters out of weight decay
(:func:`spe.lab.engine.optim.is_positional_module`) covers its weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spe.ops.common.state import AttentionState, WrappedState

__all__ = ["ShortConvState", "ShortConvolution", "check_short_conv", "depthwise_conv", "depthwise_conv_reference"]


def check_short_conv(value: int, name: str = "short_conv") -> int:
    """The short-convolution option: 0 (none) or a width K ≥ 2.

    K = 1 is refused: a width-1 "convolution" scales each channel and mixes no positions.

    Raises:
        ValueError: naming ``name`` and the value, for anything else (bools included).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value == 1:
        raise ValueError(f"{name} must be 0 (none) or an integer ≥ 2 (the width K of the convolution "
                         f"of queries, keys and values), got {value!r}")
    return value


def _left_context(width: int, causal: bool) -> int:
    """Positions before t in the window of output t: K − 1 causal, ⌊(K − 1)/2⌋ centred."""
    return width - 1 if causal else (width - 1) // 2


def _check_inputs(x: Tensor, weight: Tensor, cache: Tensor | None, causal: bool) -> None:
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"depthwise convolution: x must be (B, L, C) and weight (C, K), got x {tuple(x.shape)}, "
                         f"weight {tuple(weight.shape)}")
    if cache is None:
        return
    if not causal:
        raise ValueError("a centred (non-causal) convolution reads future inputs: it takes no cache")
    expected = (x.shape[0], weight.shape[1] - 1, x.shape[-1])
    if tuple(cache.shape) != expected:
        raise ValueError(f"the convolution's cache must be (B, K − 1, C) = {expected}, got {tuple(cache.shape)}")


def depthwise_conv(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, cache: Tensor | None = None,
                   causal: bool = True) -> tuple[Tensor, Tensor | None]:
    """Depthwise convolution of width K along the length, causal or centred (no activation).

    Args:
        x: (B, L, C) inputs.
        weight: (C, K) one filter per channel; w[:, K − 1] weighs the current input when causal.
        bias: (C,) or None.
        cache: (B, K − 1, C) the inputs of the K − 1 positions before x (causal only), as
            returned by the previous call; None: zeros (the start of a sequence).
        causal: output t reads inputs t − K + 1 … t; False: the centred window (module docstring).

    Returns:
        (B, L, C) outputs, in x's dtype, and, when causal, the new cache (B, K − 1, C): the last
        K − 1 inputs, the earlier cache's where L < K − 1 (None when not causal).

    Raises:
        ValueError: on shapes that do not fit, or a cache with ``causal=False``.
    """
    _check_inputs(x, weight, cache, causal)
    b, n, c = x.shape
    width = weight.shape[1]
    left = _left_context(width, causal)
    past = x.new_zeros(b, left, c) if cache is None else cache.to(x.dtype)
    padded = torch.cat([past, x, x.new_zeros(b, width - 1 - left, c)], dim=1)  # (B, L + K − 1, C)
    y = F.conv1d(padded.transpose(1, 2), weight[:, None, :].to(x.dtype), None if bias is None else bias.to(x.dtype),
                 groups=c).transpose(1, 2)  # (B, L, C)
    return y, (padded[:, n:] if causal else None)


def depthwise_conv_reference(x: Tensor, weight: Tensor, bias: Tensor | None = None, *,
                             cache: Tensor | None = None, causal: bool = True) -> tuple[Tensor, Tensor | None]:
    """:func:`depthwise_conv` by its definition, one output and one tap at a time, in float64:
    y_t = Σ_j w[:, j] · x_{t + j − left} (+ b), left = K − 1 causal, ⌊(K − 1)/2⌋ centred, an
    input at position p < 0 read from the cache (row K − 1 + p) or zero, at p ≥ L zero. Slow
    (O(L·K) Python steps): for tests.

    Returns:
        (B, L, C) float64 outputs and the new cache (float64; None when not causal).
    """
    _check_inputs(x, weight, cache, causal)
    b, n, c = x.shape
    width = weight.shape[1]
    left = _left_context(width, causal)
    x, weight = x.double(), weight.double()
    history = None if cache is None else cache.double()

    def value(p: int) -> Tensor:  # (B, C) the input at position p
        if 0 <= p < n:
            return x[:, p]
        if p < 0 and history is not None:
            return history[:, width - 1 + p]
        return x.new_zeros(b, c)

    rows = []
    for t in range(n):
        total = sum(weight[:, j] * value(t + j - left) for j in range(width))
        rows.append(total if bias is None else total + bias.double())
    y = torch.stack(rows, dim=1) if rows else x.new_zeros(b, 0, c)
    if not causal:
        return y, None
    return y, torch.stack([value(p) for p in range(n - width + 1, n)], dim=1)


@dataclass(frozen=True, kw_only=True)
class ShortConvState(WrappedState):
    """Decoding state of an attention layer with a short convolution: the kernel's own state and
    the convolution's memory. Layers without a short convolution keep the bare kernel state.

    Attributes:
        inner: the attention kernel's state (:data:`spe.ops.common.state.AttentionState`).
        cache: (B, K − 1, C) the last K − 1 projected inputs (queries, keys and values side by
            side, before the convolution).

    Raises:
        ValueError: if the cache is not 3-D or ``inner`` is not a kernel state.
    """

    inner: AttentionState
    cache: Tensor

    def __post_init__(self) -> None:
        if isinstance(self.inner, ShortConvState) or self.cache.dim() != 3:
            raise ValueError(f"ShortConvState holds a kernel state and a (B, K − 1, C) cache, got "
                             f"{type(self.inner).__name__} and a cache of shape {tuple(self.cache.shape)}")


class ShortConvolution(nn.Module):
    """Depthwise convolution of width K, then SiLU (:func:`depthwise_conv`).

    Args:
        channels: C.
        kernel_size: K ≥ 2.
        causal: causal (decoders) or centred (encoders).
        bias: a per-channel bias (fla's default: none).

    Weights start as ``nn.Conv1d``'s (fla's): uniform in ±1/√K.

    Raises:
        ValueError: as :func:`check_short_conv` for ``kernel_size`` (0 included: build no module).
    """

    def __init__(self, channels: int, kernel_size: int, *, causal: bool = True, bias: bool = False) -> None:
        super().__init__()
        if check_short_conv(kernel_size, "kernel_size") == 0:
            raise ValueError("kernel_size must be ≥ 2 for a ShortConvolution (0 means: build none)")
        self.causal = causal
        bound = 1 / math.sqrt(kernel_size)
        self.weight = nn.Parameter(torch.empty(channels, kernel_size).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None

    @property
    def kernel_size(self) -> int:
        """K."""
        return self.weight.shape[1]

    def forward(self, x: Tensor, cache: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """x: (B, L, C), cache: (B, K − 1, C) or None → SiLU(conv(x)) (B, L, C) and the new cache
        (None when not causal)."""
        y, cache = depthwise_conv(x, self.weight, self.bias, cache=cache, causal=self.causal)
        return F.silu(y), cache

    def extra_repr(self) -> str:
        return (f"{self.weight.shape[0]}, kernel_size={self.kernel_size}, causal={self.causal}, "
                f"bias={self.bias is not None}")

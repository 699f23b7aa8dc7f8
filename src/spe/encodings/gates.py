"""Data-dependent forget gates of an attention layer: the layer's input → the log gates the
kernels take as ``log_decay`` (:mod:`spe.ops.decay.forms`).

Letters: B = batch, L = length, C = d_model, H = num_heads, M = the kernel's feature
dimension, r = the channel gate's rank.

One convention (GLA's and Mamba2's): G_t ≤ 0, the log of the factor by which position t
multiplies the state carried from t − 1, so key n weighs exp(Σ_{n<t≤m} G_t) at query m.

- :class:`ScalarGate` (``decay="gated"``), Mamba2's parametrisation, one gate per head and
  position::

      G_{t,h} = −softplus(w_hᵀx_t + b_h) · exp(A_log,h)

  initialised at w = 0, b_h = softplus⁻¹(1) = log(e − 1) and A_log,h = log(−log γ_h) with
  RetNet's γ_h = 1 − 2^(−5−h): at w = 0 every gate is RetNet's fixed decay, so a gated model
  starts as the fixed-decay model and learns to modulate it. Why Mamba2's form and not
  simple GLA's logsigmoid(w_hᵀx_t)/τ: the head's time scale is a parameter of its own
  (A_log) and the data-dependent rate softplus(·) is 1 for every head at the start, so one
  change of the input scales the memory of a head that spans 32 positions and of one that
  spans 4,096 by the same factor, and the rate can go to 0 (keep everything) or grow (forget
  at once) in every head; with logsigmoid/τ the time scales would sit in biases deep in the
  sigmoid's tail (b ≈ 5.5 for γ = 1 − 2⁻¹² at τ = 16). It is also Gated DeltaNet's form.
  With softmax attention the gate is FoX's forget gate (Lin et al. 2025).
- :class:`ChannelGate` (``decay="gated-channel"``), GLA's, one gate per feature channel::

      G_t = logsigmoid(W₂ W₁ x_t + b) / τ,   W₁: r × C, r = 16;  W₂: H·M × r;  τ = 16

  with W₁, W₂ uniform in ±1/√fan-in (nn.Linear's default) and b = 0 (gates about
  log σ(0)/16 ≈ −0.043 at first: a memory of some 23 positions, as GLA starts). ``tied`` channels in a row share one gate:
  2 under RoPE, whose rotation of a pair commutes with a gate equal on both of its channels,
  so that the gated product stays a function of the tokens between m and n.

An attention layer builds them through its decay object (:mod:`spe.attention.decays`), under the
attribute ``decay_gate``. Both are computed in at least float32 with autocast off (the kernels
add up thousands of gates), and both live with the positional encodings because they are the layer's positional signal: the
parameter-group rule keeps them out of weight decay (:func:`spe.lab.engine.optim.is_positional_module`).
Their weights are plain parameters, not ``nn.Linear`` s, so that the trunk's GPT-2
initialisation of linear layers (:func:`spe.models.trunk.init_weights`) leaves their own
initial values alone.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spe.ops.decay import retnet_log_decay

__all__ = ["CHANNEL_GATE_RANK", "CHANNEL_GATE_TEMPERATURE", "ChannelGate", "ScalarGate"]

CHANNEL_GATE_RANK = 16  # GLA's gate_low_rank_dim
CHANNEL_GATE_TEMPERATURE = 16.0  # GLA's gate_logit_normalizer


def _wide(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """xWᵀ (+ b) in at least float32 (float64 stays), autocast off."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(device_type=x.device.type, enabled=False):
        return F.linear(x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))


def _uniform(*shape: int) -> nn.Parameter:
    """nn.Linear's default initial weights: uniform in ±1/√fan-in."""
    bound = 1 / math.sqrt(shape[-1])
    return nn.Parameter(torch.empty(*shape).uniform_(-bound, bound))


class ScalarGate(nn.Module):
    """Mamba2's gate per head and position, G = −softplus(wᵀx + b) · exp(A_log), starting at
    RetNet's fixed decays (module docstring).

    Args:
        d_model: C, the size of the layer's input.
        num_heads: H.

    Attributes:
        weight: (H, C) w, zero at first.
        bias: (H,) b, log(e − 1) at first (softplus(b) = 1).
        log_rate: (H,) A_log, log(−log γ_h) at first.
    """

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_heads, d_model))
        self.bias = nn.Parameter(torch.full((num_heads,), math.log(math.e - 1.0)))
        self.log_rate = nn.Parameter(torch.log(-retnet_log_decay(num_heads, dtype=torch.float64)).float())

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, L, C) → (B, L, H) log gates ≤ 0, in at least float32."""
        z = _wide(x, self.weight, self.bias)
        return -F.softplus(z) * torch.exp(self.log_rate.to(z.dtype))


class ChannelGate(nn.Module):
    """GLA's gate per feature channel, G = logsigmoid(W₂W₁x + b)/τ (module docstring).

    Args:
        d_model: C.
        num_heads: H.
        channels: M, the kernel's feature dimension.
        tied: consecutive channels sharing one gate (2 under RoPE); must divide M.
        rank: r of the low-rank projection.
        temperature: τ.

    Attributes:
        down: (r, C) W₁.
        up: (H·M/tied, r) W₂.
        bias: (H·M/tied,) b, zero at first.

    Raises:
        ValueError: if ``tied`` is not a positive divisor of ``channels``.
    """

    def __init__(self, d_model: int, num_heads: int, channels: int, *, tied: int = 1,
                 rank: int = CHANNEL_GATE_RANK, temperature: float = CHANNEL_GATE_TEMPERATURE) -> None:
        super().__init__()
        if tied < 1 or channels % tied:
            raise ValueError(f"a channel gate tied over {tied} channels needs a multiple of {tied} channels, "
                             f"got {channels}")
        self.num_heads, self.channels, self.tied, self.temperature = num_heads, channels, tied, temperature
        self.down = _uniform(rank, d_model)
        self.up = _uniform(num_heads * channels // tied, rank)
        self.bias = nn.Parameter(torch.zeros(num_heads * channels // tied))

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, L, C) → (B, L, H, M) log gates ≤ 0, in at least float32."""
        logits = _wide(_wide(x, self.down), self.up, self.bias)  # (B, L, H·M/tied)
        # sizes spelled out: a batch of 0 leaves -1 undetermined
        gates = F.logsigmoid(logits).view(*x.shape[:2], self.num_heads, self.channels // self.tied) / self.temperature
        return gates.repeat_interleave(self.tied, dim=-1) if self.tied > 1 else gates

    def extra_repr(self) -> str:
        return f"channels={self.channels}, tied={self.tied}, temperature={self.temperature:g}"

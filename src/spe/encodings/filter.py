"""The SPE filter: applies an SPE code to queries and keys, with optional gating.

Eq. (16)-(17) and (23)-(25) of Liutkus et al. 2021. Letters: B = batch, L = length,
H = num_heads, D = head_dim, R = num_realizations, K = num_sines.

This module holds the filter's parameters (the gate) and picks an implementation; the
mathematics lives in :mod:`spe.ops.sine.apply` (:func:`apply_code`, :func:`apply_sine_code_fused`,
:func:`apply_sine_code_blocked`) and its float64 twin in :mod:`spe.ops.sine.naive`
(:func:`apply_code_reference`). Those four names are re-exported here, where they were first
public, for code that imports them from ``spe.encodings.filter``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from spe.encodings.code import ConvCode, SineCode, SPECode
from spe.encodings.positions import require_positive
from spe.ops.conv import conv_code_product
from spe.ops.sine.apply import (apply_code, apply_sine_code_blocked, apply_sine_code_fused, gate_term,
                                scaled_input)
from spe.ops.sine.costs import MATERIALIZE_LIMIT, choose_sine_impl
from spe.ops.sine.naive import apply_code_reference
from spe.encodings.spec import LayerEncoding, head_dim, option

__all__ = ["IMPLS", "SPEFilter", "SPEOptions", "apply_code", "check_gate_init", "apply_code_reference",
           "apply_conv_code_blocked", "apply_sine_code_blocked", "apply_sine_code_fused", "build_filter"]


def check_gate_init(gate_init) -> None:
    """Raises ValueError unless ``gate_init`` is a finite number (a NaN logit makes every gated
    q̂, k̂ NaN: the loss of the first step would be the first sign)."""
    if isinstance(gate_init, bool) or not isinstance(gate_init, int | float) or not math.isfinite(gate_init):
        raise ValueError(f"gate_init must be a finite number (a gate logit), got {gate_init!r}")


def _check(queries: Tensor, keys: Tensor, code: SPECode, num_heads: int, head_dim: int) -> None:
    lq, lk, h, d = code.sizes
    if (h, d) != (num_heads, head_dim):
        raise ValueError(f"SPEFilter: the code is for num_heads {h}, head_dim {d}, this filter for "
                         f"num_heads {num_heads}, head_dim {head_dim}: draw the code from an encoding "
                         "of the filter's sizes")
    for name, x, length in (("queries", queries, lq), ("keys", keys, lk)):
        if x.dim() != 4:
            raise ValueError(f"SPEFilter: {name} must be (batch, length, num_heads, head_dim), "
                             f"got shape {tuple(x.shape)}")
        if x.shape[1:] != (length, h, d):
            raise ValueError(f"SPEFilter: {name} of shape {tuple(x.shape)} does not match the code "
                             f"(length {length}, num_heads {h}, head_dim {d})")
        if not x.is_floating_point():
            raise ValueError(f"SPEFilter: {name} must be floating point, got {x.dtype}")


def apply_conv_code_blocked(queries: Tensor, keys: Tensor, code: ConvCode, gate: Tensor | None, *,
                            block_elements: int = 1 << 22) -> tuple[Tensor, Tensor]:
    """Eq. (16)-(17) with a convSPE code applied a block of positions at a time.

    Same value as :func:`apply_code` on ``code.materialize()``, but neither the (L, H, D, R)
    codes nor their gradients are formed: each block's codes are filtered from the noise,
    applied and freed, and formed again in backward (:func:`spe.ops.conv.conv_code_product`).

    Args:
        queries, keys: (B, L, H, D).
        code: a :class:`ConvCode` for L positions.
        gate: (H, D) δ in [0, 1], or None.
        block_elements: the most elements of one block's code.

    Returns:
        q̂ (B, L, H, R) and k̂ (B, L, H, R), in the dtypes of queries and keys.
    """
    d, r = queries.shape[-1], code.num_realizations
    scale = (d * r) ** -0.25
    factor = scale if gate is None else torch.sqrt(1 - gate) * scale
    q_hat, k_hat = conv_code_product(scaled_input(queries, factor), scaled_input(keys, factor), code.noise, code.filters_q,
                                     code.filters_k, use_fft=code.use_fft, block_elements=block_elements)
    if gate is None:
        return q_hat, k_hat
    return (q_hat + gate_term(queries, gate, code.gate_noise, scale),
            k_hat + gate_term(keys, gate, code.gate_noise, scale))


IMPLS = ("auto", "fused", "materialized", "blocked", "reference")


class SPEFilter(LayerEncoding):
    """Turns queries and keys into SPE-encoded q̂, k̂ of dimension R, eq. (16)-(17).

    With ``gated=True`` each feature d has a learnable gate δ_d = sigmoid(gate logit) ∈ [0, 1]
    (eq. (23)-(25)): the effective kernel is (1 − δ_d) P_d(τ) + δ_d, so δ → 1 removes the
    positional dependence. The scale 1/(D·R)^{1/4} makes exp(q̂·k̂ / √R) equal eq. (8)'s
    attention in expectation of the exponent.

    Args:
        num_heads: H.
        head_dim: D.
        gated: learn a gate per (head, feature). Off by default, as
            :class:`~spe.models.ModelConfig` (ungated sineSPE was the better one on the Bach
            chorales; tests keep the two defaults equal).
        impl: how sineSPE codes are applied, same numbers either way: ``fused`` (never forms
            the (L, H, D, R) code; recomputes it per example), ``blocked`` (forms each block
            of positions' code once for the batch, never the whole code; fewer FLOPs than
            fused from batch 2), ``materialized`` (forms the code once per forward, shared by
            every layer; fastest for short training crops), ``reference`` (the straightforward
            form, for tests), or ``auto`` (:func:`choose_sine_impl`). convSPE codes of
            contiguous positions (:class:`~spe.encodings.code.ConvCode`) are applied
            ``blocked`` (each block's codes filtered from the noise, in forward and again in
            backward: about a third of the memory, about the same time) or materialised;
            ``auto`` blocks them above ``MATERIALIZE_LIMIT`` elements; ``fused`` materialises
            them. Other dense codes are always materialised.
        gate_init: initial gate logit (δ = sigmoid(gate_init)).

    Dtypes: q̂ and k̂ come out in the dtype of the queries and keys, and the code and gate are
    cast to it, by every ``impl`` alike. A float64 reference check of a float32 model then
    runs in float64, and under bf16/fp16 autocast (queries from a bf16 projection, a float32
    code) the products run in half precision as autocast would run them anyway; refusing a
    mismatch would refuse autocast itself. Either way q̂ is about 0.4 % off float32 at any
    position (sineSPE, positions 0-9 and 990-999): the code keeps its phases exact (the encodings'
    parameters stay float32 when a model is cast to bf16) and only the product is rounded.

    Raises:
        ValueError: if ``num_heads`` or ``head_dim`` is not a positive integer, ``gate_init``
            is not a finite number, or ``impl`` is unknown.
    """

    layer_attribute = "spe_filter"
    takes_code = True

    def __init__(self, num_heads: int, head_dim: int, *, gated: bool = False, impl: str = "auto",
                 gate_init: float = 0.0) -> None:
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"SPEFilter: impl must be one of {', '.join(IMPLS)}, got {impl!r}")
        require_positive("SPEFilter", num_heads=num_heads, head_dim=head_dim)
        check_gate_init(gate_init)
        self.num_heads, self.head_dim, self.impl = num_heads, head_dim, impl
        self.gate_logits = nn.Parameter(torch.full((num_heads, head_dim), float(gate_init))) if gated else None

    def resolve_impl(self, batch: int, code: SPECode) -> str:
        """The implementation this filter applies ``code`` with for a batch of ``batch``
        (``impl``, or :func:`choose_sine_impl`'s choice under ``auto``; a convSPE code is
        blocked or materialised, see the class docstring; dense codes are always
        materialised)."""
        if isinstance(code, ConvCode):
            if self.impl == "reference":
                return "reference"
            if self.impl == "blocked" or (self.impl == "auto" and code.num_elements > MATERIALIZE_LIMIT):
                return "blocked"
            return "materialized"
        if not isinstance(code, SineCode):
            return "reference" if self.impl == "reference" else "materialized"
        if self.impl != "auto":
            return self.impl
        h, d, two_k, r = code.weights.shape
        length = max(code.query_positions.shape[0], code.key_positions.shape[0])
        return choose_sine_impl(batch, length, h, d, two_k // 2, r)

    @property
    def gate(self) -> Tensor | None:
        """(H, D) δ in [0, 1], or None when ungated."""
        return None if self.gate_logits is None else torch.sigmoid(self.gate_logits)

    def forward(self, queries: Tensor, keys: Tensor, code: SPECode) -> tuple[Tensor, Tensor]:
        """Applies a code.

        Args:
            queries: (B, Lq, H, D).
            keys: (B, Lk, H, D); Lk may differ from Lq (cross-attention, decoding).
            code: drawn by :class:`~spe.SineSPE` or :class:`~spe.ConvSPE` for Lq query and
                Lk key positions.

        Returns:
            q_hat (B, Lq, H, R) and k_hat (B, Lk, H, R), in the dtypes of queries and keys
            (B may be 0).

        Raises:
            ValueError: if the code is for other heads or features than the filter, the shapes
                do not match the code, or queries or keys are not floating point.
        """
        gate = self.gate
        _check(queries, keys, code, self.num_heads, self.head_dim)
        if isinstance(code, SineCode):
            impl = self.resolve_impl(queries.shape[0], code)
            if impl in ("fused", "blocked"):
                apply = apply_sine_code_fused if impl == "fused" else apply_sine_code_blocked
                return (apply(queries, code.frequencies, code.phases, code.query_positions, code.weights, gate,
                              code.gate_noise),
                        apply(keys, code.frequencies, None, code.key_positions, code.weights, gate, code.gate_noise))
        if isinstance(code, ConvCode) and self.resolve_impl(queries.shape[0], code) == "blocked":
            return apply_conv_code_blocked(queries, keys, code, gate)
        qbar, kbar = code.materialize()
        apply = apply_code_reference if self.impl == "reference" else apply_code
        return apply(queries, qbar, gate, code.gate_noise), apply(keys, kbar, gate, code.gate_noise)

    def encode_queries_keys(self, q: Tensor, k: Tensor, *, code: SPECode,
                            context=None) -> tuple[Tensor, Tensor]:
        """q̂, k̂ (B, L, H, R) of q, k (B, L, H, D) under ``code`` (:meth:`forward`)."""
        return self(q, k, code)


@dataclass(kw_only=True)
class SPEOptions:
    """The options every SPE variant shares (the fields of a model config it reads).

    Attributes:
        gated: SPE gating (eq. 23-25). Off by default: on the Bach chorales ungated sineSPE
            was better than gated in every position bucket (docs/ablation.md).
        num_realizations: R, realisations of the SPE code.
        gate_init: initial gate logit (δ = sigmoid(gate_init)).
        share_across_layers: one SPE (parameters and code) for all layers, as in the paper
            (each layer keeps its own gate); False gives every layer its own SPE module and
            its own noise draw.
        code_seed: seed of the SPE code in eval mode (same checkpoint + input = same outputs).
        fixed_code: draw the SPE code from ``code_seed`` in training too, so that every step
            (and evaluation) sees the same code, instead of a fresh draw per step. A fresh
            code re-randomises the R coordinates of q̂, k̂ at every step, which a kernel with
            fixed random features (FAVOR+) cannot adapt to (docs/lra.md, the ListOps study).
        spe_impl: how sineSPE and convSPE codes are applied (same numbers either way; see
            :class:`SPEFilter` and docs/bench.md): ``auto`` (default: materialised while the
            (L, H, D, R) code has at most 2^24 elements, else fused or blocked by a cost
            model), ``materialized`` (fastest at short lengths, holds the code and its
            gradient), ``blocked`` (the batch-shared code formed per block of positions, in
            forward and again in backward: the least memory), ``fused`` or ``reference``.
    """

    gated: bool = False
    num_realizations: int = option(32, "R, SPE noise realisations", flag_type=int)
    gate_init: float = 0.0
    share_across_layers: bool = True
    code_seed: int = 0
    fixed_code: bool = False
    spe_impl: str = "auto"

    def check_options(self) -> None:
        """Raises ValueError on R that is not a positive integer, a ``gate_init`` that is not
        finite or an unknown ``spe_impl``."""
        require_positive(type(self).__name__, num_realizations=self.num_realizations)
        check_gate_init(self.gate_init)
        if self.spe_impl not in IMPLS:
            raise ValueError(f"spe_impl must be one of {', '.join(IMPLS)}, got {self.spe_impl!r}")


def build_filter(config, causal: bool) -> SPEFilter:
    """The per-layer SPE filter of a model config (``gated``, ``gate_init``, ``spe_impl``)."""
    return SPEFilter(config.num_heads, head_dim(config), gated=config.gated, gate_init=config.gate_init,
                     impl=config.spe_impl)

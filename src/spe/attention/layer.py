"""Multi-head attention layer: projections, the queries/keys positional hook, a kernel.

Letters: B = batch, L = length, C = d_model, H = num_heads, D = head_dim,
R = num_realizations, M = num_features.

SPE sits between the query/key projections and the feature map (Algorithm 1 of Liutkus
et al. 2021): q, k -> (SPEFilter) -> q̂, k̂ of size R -> φ -> linear attention.

Where a positional encoding acts decides which kernels accept it (``ACCEPTS``): codes and
rotations of queries and keys work with every kernel; a term in the attention scores
(Shaw, Music Transformer …) needs the explicit scores of softmax attention; a transform
of the kernel's features (PermuteFormer …) needs a feature map, which softmax
attention has not. A short convolution (``short_conv``) of the projected q, k, v comes before
all of them and composes with every kernel, as FoX-Pro's block does (:mod:`spe.attention.pro`:
a token shift of k and v and QK-norm before the encoding, an output gate after the kernel).

A decay (``decay``, :data:`DECAY_FORM`) weighs the kernel's sums: RetNet's constant γ_h
(``fixed``, ``learned``), or a forget gate computed from the layer's input x
(:mod:`spe.encodings.gates`): ``gated``, one per head and position (Mamba2; with softmax,
FoX), ``gated-channel``, one per feature channel of a linear kernel (GLA). Which kernel takes
which is :func:`check_decay`'s rule, the one :class:`~spe.models.TrunkConfig` asks too. Each
mode is an object of :data:`spe.attention.decays.DECAYS` (its parameters, its ``log_decay``),
which the layer looks up by name and calls, as it calls its positional module.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor, nn

from spe.attention.kernels import (
    DECAY_FORMS,
    KERNELS,
    FeatureTransform,
    KernelFeatures,
    KernelOptions,
    KernelSpec,
    decay_form,
    kernel_features,
    kernel_spec,
)
from spe.attention.pro import FoxPro, ShiftState, check_pro_options
from spe.encodings.code import SPECode
from spe.encodings.registry import POSITIONAL_SPECS, positional_names
from spe.encodings.spec import LAYER_ATTRIBUTES, EncodingState, LayerEncoding
from spe.encodings.short_conv import ShortConvolution, ShortConvState, check_short_conv
from spe.attention.decays import DECAYS, LayerDecay, layer_decay
from spe.ops.decay import NO_DECAY
from spe.ops.common.feature_maps import orthogonal_random_features
from spe.ops.linear_attn.options import kernel_dtype
from spe.ops.softmax import check_key_padding_mask, check_window, gate_bias, softmax_gates
from spe.ops.softmax.local import (block_keep, block_local_attention, block_local_step, check_blocks,
                                   prefill_block_cache)
from spe.ops.softmax.flex import check_softmax_impl
from spe.ops.common.state import AttentionState, check_state_window

__all__ = ["ACCEPTS", "ATTENTIONS", "DECAY_FORM", "OUTPUT_NORM_EPS", "POSITIONAL_ROLES", "LayerState",
           "MultiHeadAttention", "check_attention_blocks", "check_decay", "check_placement", "positional_role"]

# The kernels' names and where a positional encoding may act with each, from the kernel
# registry (spe.attention.kernels): "tokens" (added to embeddings), "queries-keys" (SPE codes,
# rotations), "scores" (a term added to q·k before the softmax), "features" (transforms of φ).
ATTENTIONS = tuple(KERNELS)
ACCEPTS = {name: spec.accepts for name, spec in KERNELS.items()}
# Where a layer's positional module acts, named by the attribute that holds it (positional_role):
# each module declares it (spe.encodings.spec.LayerEncoding.layer_attribute).
POSITIONAL_ROLES = LAYER_ATTRIBUTES
# What a layer's decoding step hands on: the kernel's state, wrapped with the shift's previous keys
# and values, then with the short convolution's cache in layers that have them, and outermost with
# the positional module's own state (a learned clock's) in layers whose module has one.
LayerState = AttentionState | ShiftState | ShortConvState | EncodingState
# The form of KernelOptions.decay (spe.attention.kernels.DECAY_FORMS) each decay mode hands the
# kernel ("none" hands none), from the decays' registry (spe.attention.decays).
DECAY_FORM = {name: decay.form for name, decay in DECAYS.items() if decay.form is not None}
# What each form is, for messages.
_DECAY_ROLE = {"constant": "acts on the sums of linear attention",
               "gate": "is a forget gate per head and position, on the sums of linear attention or on "
                       "softmax's logits (FoX, causal only)",
               "channel": "is a forget gate per feature channel of a linear kernel's features φ (not "
                          "performer's: FAVOR+ keeps one log scale per key, not per channel)"}
# ε of the RMS norm of normaliser-free kernels' outputs (fla's norm_eps).
OUTPUT_NORM_EPS = 1e-5


def check_decay(kernel: KernelSpec, decay: str, *, causal: bool = True, score_encoding: str | None = None,
                feature_transform: str | None = None) -> None:
    """The one rule for which decay an attention layer takes: the kernel must take the form
    (:meth:`KernelSpec.takes_decay`), a gate on softmax (FoX) needs the scores to itself, and a
    gate per feature channel takes no feature transform (RoPE excepted: its gates are tied
    over each rotated pair, :class:`~spe.encodings.gates.ChannelGate`).

    Args:
        kernel: the attention kernel's spec.
        decay: one of :data:`~spe.ops.decay.DECAY_MODES`.
        causal: whether the layer is causal (an encoder's when not).
        score_encoding, feature_transform: the name of the layer's score encoding or feature
            transform, if it has one.

    Raises:
        ValueError: naming the decay, what it is and what to use instead.
    """
    form = layer_decay(decay).form
    if form is None:
        return
    if not kernel.takes_decay(form, causal=causal):
        takers = [name for name, spec in KERNELS.items() if spec.takes_decay(form, causal=causal)]
        where = "" if causal else " in an encoder (not causal)"
        raise ValueError(f"decay {decay!r} {_DECAY_ROLE[form]}; {kernel.name} attention does not take "
                         f"{DECAY_FORMS[form]}{where}: use attention {', '.join(takers)}, or decay 'none'")
    if score_encoding is not None:
        raise ValueError(f"decay {decay!r} puts a forget gate on softmax's scores (FoX), which "
                         f"{score_encoding} forms itself: use positional none (FoX has no other "
                         f"encoding), or one acting on tokens or queries/keys")
    if form == "channel" and feature_transform is not None:
        on_queries_keys = ", ".join(positional_names(acts_on="queries-keys"))
        raise ValueError(f"decay {decay!r} gates each feature channel, which {feature_transform} moves or "
                         f"mixes them by position (the gated product would depend on absolute positions): use "
                         f"decay 'gated', or a positional encoding on queries and keys ({on_queries_keys}) or none")


def check_attention_blocks(kernel: KernelSpec, blocks: int | None, *, window: int | None = None,
                           decay: str = NO_DECAY, positional: LayerEncoding | None = None) -> int | None:
    """The one rule for block-local attention (``attention_blocks``, :mod:`spe.ops.softmax.local`),
    asked by the layer and by model configs: softmax attention, no window, no gate on the logits,
    no score encoding whose scores depend on more than the distance (PaTH: the tokens between).

    Args:
        kernel: the attention kernel's spec.
        blocks: N positions a block; None or 0: off.
        window, decay: the layer's window and decay mode.
        positional: the layer's positional module (or one like it), or None.

    Returns:
        N, or None when off.

    Raises:
        ValueError: naming ``attention_blocks``, its value and what it cannot be combined with.
    """
    if blocks is None or (blocks == 0 and not isinstance(blocks, bool)):
        return None
    check_blocks(blocks)
    if kernel.feature_map is not None:
        raise ValueError(f"attention_blocks ({blocks}) is block-local softmax attention: {kernel.name} attention "
                         f"is refused; use attention softmax")
    if window is not None:
        raise ValueError(f"attention_blocks ({blocks}) cannot be combined with an attention window ({window}): "
                         f"choose one")
    if positional is not None and not getattr(positional, "distance_only", True):
        raise ValueError(f"attention_blocks ({blocks}) cannot be combined with {positional.label}, whose scores "
                         f"depend on more than the distance between query and key")
    if layer_decay(decay).form is not None:
        raise ValueError(f"attention_blocks ({blocks}) cannot be combined with decay {decay!r}: use decay 'none'")
    return blocks


class MultiHeadAttention(nn.Module):
    """Self-attention with a pluggable kernel and one positional hook.

    Args:
        d_model: C.
        num_heads: H.
        attention: one of ``ATTENTIONS``: ``softmax`` (exact, O(L²)), ``performer`` (FAVOR+
            positive orthogonal random features), ``linear-relu``, ``linear-elu``, ``linear``
            (normaliser-free: identity features, no denominator, then ``output_norm``).
        causal: mask the future.
        positional: the layer's part of a positional encoding (what
            :meth:`PositionalSpec.build_layer_module <spe.encodings.spec.PositionalSpec.build_layer_module>`
            builds), the one hook: a :class:`~spe.encodings.spec.LayerEncoding`, whose hooks
            the layer calls (the call's context from the input x and the encoding's decoding
            state; queries and keys; the kernel's features; softmax's scores) and whose class
            attributes say where it acts; it is kept as the attribute its ``layer_attribute``
            names (:func:`positional_role`):

            * ``spe_filter``: an :class:`~spe.encodings.SPEFilter`, applying the SPE code given
              to :meth:`forward` to queries and keys (the kernel then sees dimension R);
            * ``rotary``: a :class:`~spe.encodings.RotaryEncoding`, rotating queries and keys
              (softmax) or their features (linear kernels, RoFormer eq. (19): rotated
              numerator, unrotated normaliser);
            * ``score_encoding``: a :class:`~spe.encodings.spec.ScoreEncoding`, a relative term
              in the scores (``ShawRelativePosition``, ``MusicRelativePosition`` …) with
              ``attend(q, k, v, *, query_offset) -> y`` and ``score_bias(q, num_keys, *,
              query_offset) -> (B, H, Lq, Lk)`` (the term it adds to q·k/√D, read by
              :meth:`attention_weights`); softmax only; or an encoding whose term for each call
              is built from the layer's input (its context) and, with ``takes_gate``, the layer's
              gate, and may keep its own decoding cache (its ``step``/``prefill``:
              :class:`~spe.encodings.PathEncoding`, PaTH);
            * ``feature_transform``: a :class:`~spe.encodings.spec.FeatureEncoding`, a transform
              of the kernel's features φ(q), φ(k) by position
              (:class:`~spe.encodings.PermuteFeatures` and the registry's other
              ``acts_on="features"`` encodings): ``(features (B, L, H, M), positions (L,)) ->
              (B, L, H, M')``, ``numerator_only`` (the normaliser keeps the untransformed
              features, which must then be strictly positive) and optionally ``feature_dim``
              (the M it was built for); linear kernels only.
        num_realizations: R, the number of realisations of SPE codes (``spe_filter`` only). The
            codes carry it (:attr:`SPECode.num_realizations`), so it may be left out: the layer
            then takes R from the first code it receives, drawing performer's projection (H, M, R)
            from the global generator at that call (or reading it from a state dict loaded
            before). Given, it is the layer's R from the start (performer's projection is drawn
            here), and every code is checked against it where the layer holds something of
            size R: a ``gated-channel`` gate (R channels) takes codes of that R only (ValueError
            naming both). Other layers take a test-time R of any size (performer: projections of
            the new size drawn from a fixed seed, so the same input gives the same output).
        num_features: M, random features for ``performer``.
        chunk_size: chunk length of causal linear attention.
        window: W, causal sliding-window attention: position m attends to n ∈ (m − W, m]
            only, in :meth:`forward` and :meth:`step` alike (decoding then keeps the last W
            keys, so memory stays O(W)). None: the whole past. Settable later
            (``layer.window = W``), e.g. at test time; not with a score encoding.
        decay: ``none``, ``fixed`` (RetNet's γ_h = 1 − 2^(−5−h) on the lag, h = 0 … H − 1)
            or ``learned`` (γ_h = sigmoid(``decay_logit``_h), an (H,) parameter initialised
            at RetNet's values; not weight-decayed: the engine decays nn.Linear weights
            only): key n weighs γ^{m−n} at query m (γ^{|m−n|} when not causal), in forward
            and step alike (:mod:`spe.ops.decay`); linear kernels only. Or a forget gate
            from the layer's input x, key n weighing exp(Σ_{n<t≤m} G_t) at query m (the gates
            between them, either way when not causal): ``gated``, G (B, L, H) from a
            :class:`~spe.encodings.gates.ScalarGate` (``decay_gate``; Mamba2's form, starting
            at RetNet's fixed decays), every kernel (softmax: FoX, causal only, no score
            encoding); ``gated-channel``, G (B, L, H, M) from a
            :class:`~spe.encodings.gates.ChannelGate` (GLA's), linear kernels but performer,
            no feature transform, under RoPE tied over rotated pairs. Gates are 0 at
            padding (padding passes the sums on unchanged).
        short_conv: K, a depthwise convolution of width K then SiLU on the projected queries,
            keys and values (fla's ``ShortConvolution``; causal, or centred when the layer is
            not, :mod:`spe.encodings.short_conv`), before SPE, RoPE and the feature maps;
            decoding then carries the last K − 1 projected inputs (:class:`ShortConvState`).
            0: none (no parameter, the plain kernel states).
        output_gate, qk_norm, kv_shift, output_norm: FoX-Pro's block (:mod:`spe.attention.pro`),
            each off by default (no parameter, the plain states): y ⊙ sigmoid(W_o x) before the
            output projection; RMS-normalised q and k per head with a learnable scale, before
            the positional encoding; k and v shifted by a data-dependent α_t towards the
            previous position's (decoding then carries them, :class:`~spe.attention.pro.ShiftState`);
            the per-head RMS norm of the output (``output_norm`` below) for kernels that do not
            have it (``linear`` always has it).
        softmax_impl: softmax's parallel path (:class:`~spe.attention.kernels.KernelOptions`):
            ``auto`` (FlexAttention on CUDA for FoX's gate, a window or a score term it takes,
            :mod:`spe.ops.softmax.flex`), ``flex`` or ``blocks``; settable later
            (``spe.attention.kernels.set_softmax_impl``).
            Other kernels ignore it.
        attention_blocks: N, the Music Transformer's block-local attention (Huang et al. 2018,
            after Liu et al. 2018; :mod:`spe.ops.softmax.local`): blocks of N positions, each
            query attends to its own block (causally in a decoder) and to the whole previous
            one, in :meth:`forward`, :meth:`step` and :meth:`prefill` alike; memory O(L·N),
            decoding keeps at most 2N keys. With a score encoding each window's keys are offset
            by the window's start (exact for terms of the distance alone: relative distances up
            to 2N − 1). None or 0: off. Softmax only; not with a window, a gate or PaTH.
            Settable later (``layer.attention_blocks = N``).

    Raises:
        ValueError: on an unknown attention name, d_model not divisible by num_heads, a
            score encoding with a linear kernel, a feature transform with softmax or of
            another feature dimension, RoPE on an odd feature dimension or with features that can be 0, or a window that is
            not positive, not causal or combined with a score encoding, an unknown decay or a
            decay a kernel does not take (what each kernel accepts: its spec in
            :mod:`spe.attention.kernels`; the rule: :func:`check_decay`), or a
            ``short_conv`` that is not 0 or an int ≥ 2; ``num_realizations`` that is not a
            positive int, given without an SPE filter, or left out with SPE and decay
            ``gated-channel`` (whose gate is built for R channels); a FoX-Pro option that is
            not a bool; an unknown ``softmax_impl``.
        TypeError: for a ``positional`` module that is no
            :class:`~spe.encodings.spec.LayerEncoding` (:func:`positional_role`).

    Normaliser-free kernels (``linear``: ``KernelSpec.normalizer_free``) get a per-head RMS norm
    of their output before the output projection, ``output_norm`` (fla's ``linear_attn`` and
    GLA): one learnable weight per head_dim channel, shared by the heads, ε = 1e-5; other kernels
    get the same norm with ``output_norm=True`` (FoX-Pro's).
    """

    def __init__(self, d_model: int, num_heads: int, *, attention: str = "performer",
                 causal: bool = True, positional: nn.Module | None = None,
                 num_realizations: int | None = None, num_features: int = 64,
                 chunk_size: int = 64, window: int | None = None, decay: str = NO_DECAY,
                 short_conv: int = 0, output_gate: bool = False, qk_norm: bool = False,
                 kv_shift: bool = False, output_norm: bool = False, softmax_impl: str = "auto",
                 attention_blocks: int | None = None) -> None:
        super().__init__()
        self.softmax_impl = check_softmax_impl(softmax_impl)
        # the one positional hook: the module's kind says where it acts; it is kept under the
        # attribute of that place (the state-dict keys: spe_filter.*, rotary.*, ...)
        role = positional_role(positional)
        spe_filter, rotary, score_encoding, feature_transform = (
            positional if role == name else None for name in POSITIONAL_ROLES)
        self.kernel = kernel_spec(attention)
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.attention, self.causal, self.chunk_size = attention, causal, chunk_size
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        # built only when asked: layers without one keep their parameters, draws and states
        self.qkv_conv = (ShortConvolution(3 * d_model, short_conv, causal=causal)
                         if check_short_conv(short_conv) else None)
        self.spe_filter = spe_filter
        coded = positional is not None and positional.takes_code
        _check_realizations(num_realizations, coded)
        # R: the codes carry it; given here, it is the layer's from the start, else the first code's
        self.num_realizations = num_realizations
        self.kernel_dim = num_realizations if coded else self.head_dim
        if self.kernel.random_features:
            self.num_features = num_features
            self.register_buffer("projection", None if self.kernel_dim is None else
                                 orthogonal_random_features(num_heads, num_features, self.kernel_dim))
        _check_positional(self.kernel, causal, positional)
        self.rotary, self.score_encoding = rotary, score_encoding
        # a transform that keeps channels together (RoPE's pairs) shares a gate per channel among them
        tie = positional.channel_tie if positional is not None and positional.transforms_features else 1
        check_decay(self.kernel, decay, causal=causal,
                    score_encoding=(type(positional).__name__
                                    if _forms_scores(positional) and not positional.takes_gate else None),
                    feature_transform=positional.label if tie == 1 and _transforms(positional) else None)
        self.decay = decay  # the mode's name: the layer's decay object is looked up from it (decay_kind)
        # a channel gate acts over the kernel's features: head_dim, or R with SPE
        self.decay_kind.build(self, d_model=d_model, num_heads=num_heads, features=self.kernel_dim, tied=tie)
        check_pro_options(output_gate=output_gate, qk_norm=qk_norm, kv_shift=kv_shift, output_norm=output_norm)
        self.output_norm = (nn.RMSNorm(self.head_dim, eps=OUTPUT_NORM_EPS)
                            if self.kernel.normalizer_free or output_norm else None)
        # built only when asked, as the short convolution: other layers keep their parameters and states
        self.pro = (FoxPro(d_model, num_heads, output_gate=output_gate, qk_norm=qk_norm, kv_shift=kv_shift)
                    if output_gate or qk_norm or kv_shift else None)
        feature_dim = num_features if self.kernel.random_features else self.head_dim
        if _transforms(positional):
            what = "num_features" if self.kernel.random_features else "head_dim"
            positional.check_features(feature_dim, what)
        self.feature_transform = feature_transform
        constant = None if self.decay_kind.from_input else self.log_decay()  # gates: check_decay's
        self.kernel.check(KernelOptions(causal=causal, decay=constant), transform=self._transform)
        self._attention_blocks = None
        self.window = window
        self.attention_blocks = attention_blocks

    @property
    def positional(self) -> LayerEncoding | None:
        """The layer's positional module (kept under the attribute its kind names), or None."""
        for name in POSITIONAL_ROLES:
            module = getattr(self, name, None)
            if module is not None:
                return module
        return None

    @property
    def _transform(self) -> FeatureTransform | None:
        # RoPE and the feature encodings act on the kernel's features: q and k for softmax,
        # φ(q) and φ(k) otherwise (numerator-only ones, RoFormer eq. 19: the normaliser keeps them
        # as they were)
        module = self.positional
        if not _transforms(module):
            return None
        return FeatureTransform(module.transform_features, numerator_only=module.numerator_only,
                                name=module.label)

    @property
    def decay_kind(self) -> LayerDecay:
        """The layer's decay object (:data:`spe.attention.decays.DECAYS`), from its mode's name."""
        return DECAYS[self.decay]

    def log_decay(self, x: Tensor | None = None, key_padding_mask: Tensor | None = None) -> Tensor | None:
        """The kernel's ``log_decay``, or None without one: (H,) log γ_h of a constant decay
        (float32; learned: logsigmoid of the logits, exact where sigmoid would round γ to 1 in
        float32); a gate (B, L, H) or (B, L, H, M) of the input x (B, L, C) in at least
        float32, 0 where ``key_padding_mask`` (B, L) is True
        (:meth:`spe.attention.decays.LayerDecay.log_decay`).

        Raises:
            ValueError: for a gate without x.
        """
        return self.decay_kind.log_decay(self, x, key_padding_mask)

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
            if _forms_scores(self.positional):
                raise ValueError(f"an attention window cannot be combined with "
                                 f"{type(self.positional).__name__}, which forms its own scores")
            if self.attention_blocks is not None:
                raise ValueError(f"an attention window ({value}) cannot be combined with attention_blocks "
                                 f"({self.attention_blocks}): choose one")
            self.kernel.check(KernelOptions(window=value))
        self._window = value

    @property
    def attention_blocks(self) -> int | None:
        """N of block-local attention (:mod:`spe.ops.softmax.local`), None: off."""
        return getattr(self, "_attention_blocks", None)  # layers pickled before it

    @attention_blocks.setter
    def attention_blocks(self, value: int | None) -> None:
        self._attention_blocks = check_attention_blocks(self.kernel, value, window=self.window, decay=self.decay,
                                                        positional=self.positional)

    def _block_term(self, options: KernelOptions):
        """The score term's attention over block windows (its ``attend``), None without one."""
        term = options.score_term
        return None if term is None else term.attend

    def _parallel(self, f: KernelFeatures, v: Tensor, options: KernelOptions) -> Tensor:
        """The kernel's parallel function, or block-local attention with ``attention_blocks``."""
        if self.attention_blocks is None:
            return self.kernel.parallel(f, v, options)
        return block_local_attention(f.q, f.k, v, self.attention_blocks, causal=options.causal,
                                     key_padding_mask=options.key_padding_mask,
                                     attend_term=self._block_term(options))

    def _step(self, f: KernelFeatures, v: Tensor, state, options: KernelOptions):
        """The kernel's step function, or block-local attention's (a cache of at most 2N keys)."""
        if self.attention_blocks is None:
            return self.kernel.step(f, v, state, options)
        return block_local_step(f.q, f.k, v, state, self.attention_blocks, attend_term=self._block_term(options))

    @torch.no_grad()
    def redraw_features(self, generator: torch.Generator | None = None) -> None:
        """Draws new FAVOR+ projections (no-op for kernels without random features, and for a
        layer still waiting for its first SPE code to know R)."""
        if self.kernel.random_features and self.projection is not None:
            self.projection.copy_(orthogonal_random_features(
                self.num_heads, self.num_features, self.kernel_dim, generator=generator))

    def project(self, x: Tensor, code: SPECode | None, *, key_padding_mask: Tensor | None = None,
                times: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values as the kernel receives them in :meth:`forward` (after the
        short convolution and FoX-Pro's shift and QK-norm, if any, and the positional module's
        queries-keys hook; before RoPE and feature maps).

        Args:
            x: (B, L, C) the layer's input.
            code: the SPE code for these L positions (required iff the layer has an SPE filter).
            key_padding_mask: (B, L) bool, True at padding (as :meth:`forward`).
            times: (B, L) per-sequence times (as :meth:`forward`).

        Returns:
            q, k of shape (B, L, H, E) (E = R with SPE, carrying the filter's 1/(D·R)^{1/4}
            scale; E = D otherwise) and v of shape (B, L, H, D).
        """
        context, _ = self._prepare(x, self._positions(None, x) if times is None else times, None, key_padding_mask)
        q, k, v, _, _ = self._project(x, code, None, key_padding_mask, context=context)
        return q, k, v

    def _prepare(self, x: Tensor, positions: Tensor | None, state, key_padding_mask: Tensor | None = None):
        """The positional module's context for a call on x (B, L, C) at ``positions`` and its state
        after it (:meth:`LayerEncoding.prepare <spe.encodings.spec.LayerEncoding.prepare>`);
        without a module, the positions and None."""
        module = self.positional
        if module is None:
            return positions, None
        return module.prepare(x, positions, state, key_padding_mask=key_padding_mask)

    def _project(self, x: Tensor, code: SPECode | None, conv_cache: Tensor | None,
                 key_padding_mask: Tensor | None = None, *, previous: tuple[Tensor, Tensor] | None = None,
                 context=None):
        """:meth:`project` going on from the short convolution's ``conv_cache`` (B, K − 1, 3C)
        and the shift's ``previous`` keys and values (B, H, D) (None: the start), with the
        positional module's ``context`` (:meth:`_prepare`), and the new caches (None without a
        convolution, a shift)."""
        b, n, _ = x.shape
        qkv = self.qkv(x)  # (B, L, 3C)
        if self.qkv_conv is not None:
            if key_padding_mask is not None:
                # padded rows read as the zeros past a sequence's end: padding never reaches a real position
                qkv = qkv.masked_fill(key_padding_mask[..., None], 0.0)
            qkv, conv_cache = self.qkv_conv(qkv, conv_cache)
        q, k, v = qkv.view(b, n, 3, self.num_heads, self.head_dim).unbind(2)  # (B, L, H, D)
        if self.pro is not None:  # FoX-Pro's shift and QK-norm: before any positional encoding
            q, k, v, previous = self.pro(x, q, k, v, previous, key_padding_mask)
        module = self.positional
        if module is not None:
            if module.takes_code:
                if code is None:
                    raise ValueError("this attention layer uses SPE: pass the code drawn for this forward")
                self._take_realizations(code)
            q, k = module.encode_queries_keys(q, k, code=code, context=context)  # SPE: (B, L, H, R)
        return q, k, v, conv_cache, previous

    def _take_realizations(self, code: SPECode) -> None:
        """R from ``code``: the layer's own if it had none yet; refused if it differs from the R
        of a gate per channel of q̂, k̂ (its parameters are sized by it).

        Raises:
            ValueError: naming the code's R and the layer's.
        """
        r = code.num_realizations
        if self.kernel_dim is None:
            self._set_realizations(r)
        elif r != self.kernel_dim and self.decay_kind.sized_by_features:
            raise ValueError(f"the SPE code has num_realizations {r} but this layer's decay 'gated-channel' gates "
                             f"num_realizations {self.kernel_dim} channels: draw codes of R = {self.kernel_dim}")

    def _set_realizations(self, r: int) -> None:
        """Fixes the layer's R (it had none): performer then draws its projection (H, M, R)."""
        self.num_realizations = self.kernel_dim = r
        if self.kernel.random_features:
            # a buffer made under inference mode could not be used by a later training forward
            with torch.inference_mode(False), torch.no_grad():
                projection = orthogonal_random_features(self.num_heads, self.num_features, r)
                self.projection = projection.to(self.qkv.weight)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        saved = state_dict.get(prefix + "projection")
        if self.kernel.random_features and self.kernel_dim is None and saved is not None:
            self._set_realizations(saved.shape[-1])  # a layer still waiting for its first code takes the saved R
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _projection_for(self, dim: int) -> Tensor:
        if self.projection is None:
            raise ValueError("this performer layer takes R from its first SPE code: run it on a code first, or "
                             "build it with num_realizations")
        if dim == self.projection.shape[-1]:
            return self.projection
        # A test-time R differs from the trained one: FAVOR+ needs projections of the new size;
        # draw them from a fixed seed so that the same input still gives the same output.
        generator = torch.Generator().manual_seed(dim)
        return orthogonal_random_features(self.num_heads, self.num_features, dim,
                                          generator=generator).to(self.projection)

    def features(self, q: Tensor, k: Tensor, positions: Tensor | None) -> KernelFeatures:
        """The kernel's features of q, k (B, L, H, E): φ (with FAVOR+ key scales), then RoPE or
        the feature transform at ``positions`` (L,) (:func:`~spe.attention.kernels.kernel_features`)."""
        projection = self._projection_for(q.shape[-1]) if self.kernel.random_features else None
        return kernel_features(self.kernel, q, k, projection=projection, transform=self._transform,
                               positions=positions)

    def feature_sizes(self) -> tuple[int, int]:
        """(M, M'): the feature sizes of a linear kernel's numerator and normaliser, hence of its
        decoding sums S (M × D) and z (M'), after any transform (some double M; a
        numerator-only one leaves the normaliser's M). Softmax: the query/key size, twice.

        Raises:
            ValueError: for an SPE layer that does not know R yet (built without
                ``num_realizations`` and not run on a code).
        """
        if self.kernel_dim is None:
            raise ValueError("this SPE layer takes R from its first code: run it on a code first, or build it "
                             "with num_realizations")
        probe = torch.zeros(1, 1, self.num_heads, self.kernel_dim, device=self.qkv.weight.device)
        f = self.features(probe, probe, torch.zeros(1, dtype=torch.int64, device=probe.device))
        return f.q.shape[-1], (f.q if f.normalizer is None else f.normalizer[0]).shape[-1]

    def _options(self, x: Tensor, key_padding_mask: Tensor | None = None, context=None) -> KernelOptions:
        """The kernel options of a call on the layer's input x (B, L, C) (gates come from x; a
        score term from the positional module, given the call's ``context``; one that takes the
        gate applies it itself, so the kernel gets none)."""
        module, decay = self.positional, self.log_decay(x, key_padding_mask)
        term = None
        if _forms_scores(module):
            term = module.score_term(context, decay if module.takes_gate else None)
            decay = None if module.takes_gate else decay
        return KernelOptions(causal=self.causal, window=self.window, chunk_size=self.chunk_size,
                             key_padding_mask=key_padding_mask, score_term=term, decay=decay,
                             softmax_impl=getattr(self, "softmax_impl", "auto"))  # layers pickled before it

    def _output(self, y: Tensor, x: Tensor | None = None) -> Tensor:
        """The kernel's output (B, L, H, D) → the layer's (B, L, C): the RMS norm of normaliser-free
        kernels (or asked for), FoX-Pro's gate of the layer's input x (B, L, C) (required with
        one), then the output projection."""
        if self.output_norm is not None:  # in at least float32, as fla's (a bf16 mean of squares is coarse)
            y = self.output_norm(y.to(kernel_dtype(y))).to(y.dtype)
        if self.pro is not None:
            y = self.pro.gate_output(y, x)
        return self.out(y.flatten(2))

    def step(self, x: Tensor, code: SPECode | None,
             state: LayerState | None, *, times: Tensor | None = None) -> tuple[Tensor, LayerState]:
        """One causal decoding step with an explicit state; equals :meth:`forward` position by position.

        The kernel's step function does the work (:mod:`spe.attention.kernels`, over
        :mod:`spe.ops.linear_attn.recurrent` and :mod:`spe.ops.softmax.recurrent`): linear
        kernels keep running sums (:class:`~spe.ops.LinearAttentionState`: S = Σ φ(k̂_n) v_nᵀ
        and z = Σ φ(k̂_n), so every step costs the same) or, with a window, the last W keys and values
        (:class:`~spe.ops.RecentKeys`); FAVOR+ their ``Scaled`` subclasses; softmax a
        :class:`~spe.ops.KVCache` (with ``attention_blocks`` N, the keys and values from the start of
        the previous block on, at most 2N: :func:`~spe.ops.softmax.local.block_cache`). States count
        the positions seen (RoPE and score encodings need the index of the new one) and record
        their window. With a short convolution the
        state is a :class:`ShortConvState`: the kernel's state and the last K − 1 projected inputs.

        Args:
            x: (B, 1, C) the new position's input.
            code: SPE code for this single position (queries and keys).
            state: the previous step's state, or None at position 0.
            times: (B, 1) the position's time for an encoding that reads per-sequence times (the
                onset clock), given to it in place of the position (as :meth:`forward`).

        Returns:
            (B, 1, C) output and the new state.

        Raises:
            ValueError: on a state built with another window.
            TypeError: on a state of the wrong kind for this kernel (or for a layer with or
                without a short convolution).
        """
        state, conv_cache, previous, encoding_state = self._split_state(state)
        position = 0 if state is None else state.position
        context, encoding_state = self._prepare(x, torch.tensor([position], device=x.device) if times is None
                                                else times, encoding_state)
        q, k, v, conv_cache, previous = self._project(x, code, conv_cache, previous=previous, context=context)
        f = self.features(q, k, context)
        y, state = self._step(f, v, state, self._options(x, None, context))
        return self._output(y, x), self._join_state(state, conv_cache, previous, encoding_state)

    def _split_state(self, state):
        """A layer state, checked, as (the kernel's state, the short convolution's cache or None, the
        shift's previous keys and values or None, the positional module's state or None)."""
        encoding_state = None
        if isinstance(state, EncodingState):
            state, encoding_state = state.inner, state.encoding
        elif state is not None and self.positional is not None and self.positional.stateful:
            raise TypeError(f"this layer's {self.positional.label} keeps a decoding state of its own: it "
                            f"decodes with an EncodingState, got {type(state).__name__}")
        cache = None
        if self.qkv_conv is not None and state is not None:
            if not isinstance(state, ShortConvState):
                raise TypeError(f"this layer has a short convolution: it decodes with a ShortConvState, "
                                f"got {type(state).__name__}")
            state, cache = state.inner, state.cache
        state, previous = (state, None) if self.pro is None else self.pro.split_state(state)
        kinds = self.kernel.state_types
        if state is not None and not isinstance(state, kinds):
            raise TypeError(f"{self.attention} attention decodes with a {' or '.join(t.__name__ for t in kinds)}, "
                            f"got {type(state).__name__}")
        check_state_window(state, self.window)
        return state, cache, previous, encoding_state

    def _join_state(self, state: AttentionState, conv_cache: Tensor | None, previous=None,
                    encoding_state=None) -> LayerState:
        if self.pro is not None:
            state = self.pro.join_state(state, previous)
        state = state if self.qkv_conv is None else ShortConvState(inner=state, cache=conv_cache)
        return state if encoding_state is None else EncodingState(inner=state, encoding=encoding_state)

    def prefill(self, x: Tensor, code: SPECode | None,
                state: LayerState | None = None, *, times: Tensor | None = None) -> tuple[Tensor, LayerState]:
        """Positions p … p + L − 1 in one parallel pass (p = 0, or where ``state`` stopped), and the
        state :meth:`step` goes on from.

        The output is :meth:`forward`'s; the state is the one L :meth:`step` calls from ``state``
        would leave (the kernel's prefill function: linear kernels
        :func:`~spe.ops.causal_linear_attention_with_state`, softmax the cache of the keys and
        values), so a prompt costs one forward instead of L steps. Gradients flow through it
        (into ``state``'s tensors too, unless they are detached): state passing trains with it.

        Args:
            x: (B, L, C) the inputs of positions p … p + L − 1.
            code: SPE code for these L positions (SPE only), the realisation ``state``'s keys had.
            state: a state of this layer to go on from (None: position 0); linear kernels only.
            times: (B, L) per-sequence times (as :meth:`forward`).

        Returns:
            (B, L, C) output and the state after position p + L − 1.

        Raises:
            ValueError: if the layer is not causal, on a state built with another window, or a
                state with softmax (a KV cache goes on with :meth:`step`).
            TypeError: on a state of the wrong kind (as :meth:`step`).
        """
        if not self.causal:
            raise ValueError("prefill decodes causally: this attention layer is not causal")
        state, conv_cache, previous, encoding_state = self._split_state(state)
        start, n = (0 if state is None else state.position), x.shape[1]
        positions = torch.arange(start, start + n, device=x.device)
        context, encoding_state = self._prepare(x, positions if times is None else times, encoding_state)
        q, k, v, conv_cache, previous = self._project(x, code, conv_cache, previous=previous, context=context)
        f = self.features(q, k, context)
        options = self._options(x, None, context)
        if self.attention_blocks is not None:
            if state is not None:
                raise ValueError("block-local attention prefills from the start only: go on from its cache with step")
            y, state = self._parallel(f, v, options), prefill_block_cache(f.k, v, self.attention_blocks)
        else:
            y, state = self.kernel.prefill(f, v, options, state)
        return self._output(y, x), self._join_state(state, conv_cache, previous, encoding_state)

    def forward(self, x: Tensor, code: SPECode | None = None, *, positions: Tensor | None = None,
                key_padding_mask: Tensor | None = None, times: Tensor | None = None) -> Tensor:
        """Args:
            x: (B, L, C).
            code: SPE code for L positions; required iff the layer has an SPE filter.
            positions: (L,) positions for RoPE and feature transforms (default 0 … L − 1);
                score encodings use index distances and refuse them.
            key_padding_mask: (B, L) bool, True at padding (PyTorch's convention): those
                keys get no weight in any query's output (softmax: masked scores; linear
                kernels: zero features, values and normaliser terms, and a log scale that
                cannot be the common one; score terms: masked scores; the centred short
                convolution reads zeros there), so what a padded position holds never reaches
                a real one. Non-causal layers only.
            times: (B, L) per-sequence times (the onset clock's, :mod:`spe.encodings.onset`) for
                an encoding that reads them: its ``prepare`` gets them in place of the positions.

        Returns:
            (B, L, C). Outputs at padded positions are computed but meaningless. An empty
            input (B = 0 or L = 0) gives an empty output of that shape (no code needed).

        Raises:
            ValueError: on a padding mask with a causal layer or of the wrong shape;
                positions with a score encoding; ``x`` that is not (B, L, C).
        """
        self._check_call(positions, key_padding_mask)
        if x.dim() != 3 or x.shape[-1] != self.out.in_features:
            raise ValueError(f"x must be (batch, length, d_model = {self.out.in_features}), got shape {tuple(x.shape)}")
        if x.numel() == 0:  # nothing to attend (gates, convolutions and chunk sizes need a position)
            return self.out(x)
        context, _ = self._prepare(x, self._positions(positions, x) if times is None else times, None,
                                   key_padding_mask)
        q, k, v, _, _ = self._project(x, code, None, key_padding_mask, context=context)
        options = self._options(x, key_padding_mask, context)
        self.kernel.check(options)
        y = self._parallel(self.features(q, k, context), v, options)
        return self._output(y, x)

    def attention_weights(self, x: Tensor, code: SPECode | None = None, *, positions: Tensor | None = None,
                          key_padding_mask: Tensor | None = None, exact: bool = False,
                          dtype: torch.dtype | None = None, times: Tensor | None = None) -> Tensor:
        """The attention matrix A this layer applies in :meth:`forward`: before the output
        projection, y[b, m, h] = Σ_n A[b, h, m, n] v[b, n, h].

        Softmax: A = softmax_n(q_m·k_n/√E + s(m, n)), formed explicitly with what the layer
        adds: RoPE's rotation of q and k, the score encoding's term s (a bias; Shaw's and Music
        Transformer's q_m·a_{n−m}/√D; the SPE oracle's own scores, ``weights``), FoX's gate
        Σ_{n<t≤m} G_t, the causal mask, the window and the key padding. Shaw's value term is no
        weight: its output is A v + Σ_n A_mn a^V_{n−m}.

        Linear kernels: the matrix the kernel estimates, formed by the kernel's own parallel
        function on one-hot values v_n = e_n (y is linear in v, so column n of its output is
        A's), hence with every term of :meth:`forward` as forward applies it: A_mn =
        w_mn φ(q̂_m)·φ(k̂_n) / Σ_n' w_mn' ψ(q̂_m)·ψ(k̂_n'), with the SPE code's q̂, k̂, FAVOR+'s
        key scales, RoPE or a feature transform, the decay or gates w, the window and the
        padding; ψ = φ except under numerator-only transforms (RoPE …), whose normaliser
        keeps the untransformed features (rows then need not sum to 1, entries may be
        negative). ``linear`` (normaliser-free) has no denominator: A_mn = w_mn q̂_m·k̂_n,
        unnormalised, and its ``output_norm`` acts on the rows of A v (the output), not of A.

        Args:
            x, code, positions, key_padding_mask, times: as :meth:`forward`.
            exact: the softmax attention of the layer's queries and keys instead:
                softmax_n(q̂_m·k̂_n/√E + log w_mn) with the layer's masks and decay (a
                constant γ^{|m−n|} or the gates between m and n): what FAVOR+ estimates, and
                for other linear kernels the softmax attention they stand in for (the offline
                A of appendix D.1, Liutkus et al. 2021). Softmax layers: the same as False.
            dtype: the dtype A is formed in (scores, softmax, the kernel's sums); q and k are
                projected in the layer's dtype, then cast. Default: the kernel's (the widest
                of q, k and float32); float64 for offline analysis.

        Returns:
            (B, H, L, L) in ``dtype``: A[b, h, m, n], the weight of key n in query m's output.
            Entries of padding keys are 0, as are keys after m in causal layers, keys
            W or more positions back under a window W and keys outside the own and previous
            block under ``attention_blocks`` (then formed L × L all the same, for analysis); rows
            sum to 1 for softmax (and ``exact``) and for linear kernels with normalised, untransformed denominators.
            Rows of padded queries are what the layer computes there (meaningless). Memory
            O(B·H·L²).

        Raises:
            ValueError: as :meth:`forward`; with ``exact``, for a linear kernel's feature
                transform (RoPE and the feature encodings act on φ, which softmax has
                not) or a gate per feature channel (no term of the logits).
        """
        self._check_call(positions, key_padding_mask)
        context, _ = self._prepare(x, self._positions(positions, x) if times is None else times, None,
                                   key_padding_mask)
        q, k, _, _, _ = self._project(x, code, None, key_padding_mask, context=context)
        dtype = kernel_dtype(q, k) if dtype is None else dtype
        q, k = q.to(dtype), k.to(dtype)
        options = self._options(x, key_padding_mask, context)
        self.kernel.check(options)
        if options.decay is not None:  # gates in float32 would round a float64 matrix's weights
            options = replace(options, decay=options.decay.to(torch.promote_types(options.decay.dtype, dtype)))
        if self.kernel.feature_map is None:  # softmax: RoPE rotates q and k themselves
            f = self.features(q, k, context)
            return _softmax_weights(f.q, f.k, options, self.attention_blocks)
        if exact:
            if self._transform is not None:
                raise ValueError(f"exact weights are the softmax of q̂·k̂: {self._transform.name} transforms the "
                                 f"features φ of {self.attention} attention, which softmax has not")
            return _softmax_weights(q, k, options)
        b, n = x.shape[:2]
        one_hot = torch.eye(n, dtype=dtype, device=x.device)[None, :, None, :].expand(b, n, self.num_heads, n)
        y = self.kernel.parallel(self.features(q, k, context), one_hot, options)  # (B, Lq, H, Lk)
        return y.permute(0, 2, 1, 3)

    def _check_call(self, positions: Tensor | None, key_padding_mask: Tensor | None) -> None:
        """:meth:`forward`'s refusals: positions with a score encoding, padding in a causal layer."""
        if positions is not None and _forms_scores(self.positional):
            raise ValueError(f"{type(self.positional).__name__} works on index distances; it takes no "
                             f"positions")
        if key_padding_mask is not None and self.causal:
            raise ValueError("key_padding_mask needs a non-causal layer, got causal=True")

    def _positions(self, positions: Tensor | None, x: Tensor) -> Tensor | None:
        """The (L,) positions of RoPE or the feature transform: as given, else 0 … L − 1."""
        if self._transform is not None and positions is None:
            return torch.arange(x.shape[1], device=x.device)
        return positions


def positional_role(module: nn.Module | None) -> str | None:
    """Where an attention layer keeps its positional module, as the attribute that holds it (one of
    :data:`POSITIONAL_ROLES`, the module's own
    :attr:`~spe.encodings.spec.LayerEncoding.layer_attribute`), or None for no module.

    ``spe_filter``: an :class:`~spe.encodings.SPEFilter` (applies the model's SPE code to q and
    k); ``rotary``: a :class:`~spe.encodings.RotaryEncoding`; ``score_encoding``: a
    :class:`~spe.encodings.spec.ScoreEncoding` (a term in softmax's scores,
    :class:`~spe.attention.kernels.ScoreTerm`); ``feature_transform``: a
    :class:`~spe.encodings.spec.FeatureEncoding` (a transform of a linear kernel's features).

    Raises:
        TypeError: for a module that is not a :class:`~spe.encodings.spec.LayerEncoding`.
    """
    if module is None:
        return None
    if isinstance(module, LayerEncoding) and module.layer_attribute in POSITIONAL_ROLES:
        return module.layer_attribute
    raise TypeError(f"positional must be an SPEFilter, a RotaryEncoding, a score encoding or a feature "
                    f"transform (a spe.encodings.spec.LayerEncoding declaring one of "
                    f"{', '.join(POSITIONAL_ROLES)}), got "
                    f"{type(module).__name__}")


def _forms_scores(module: LayerEncoding | None) -> bool:
    return module is not None and module.forms_scores


def _transforms(module: LayerEncoding | None) -> bool:
    return module is not None and module.transforms_features


# Why a kernel refuses an encoding, by where the encoding acts.
_REFUSED = {"scores": "adds a term to the attention scores, which {attention} attention never forms",
            "features": "transforms the features φ(q), φ(k) of a linear kernel, which {attention} attention "
                        "does not have"}


def check_placement(kernel: KernelSpec, acts_on: str | None, what: str) -> None:
    """The one rule for where a positional encoding may act with a kernel: the kernel's spec
    must accept the place (:attr:`KernelSpec.accepts`), asked by model configs (by name) and
    by the layer (by module) alike.

    Args:
        kernel: the attention kernel's spec.
        acts_on: where the encoding acts (``spe.encodings.spec.PLACES``), or None (none).
        what: how messages name the encoding (``positional 'shaw'``, a module's label).

    Raises:
        ValueError: naming the encoding, why the kernel refuses it, the encodings it takes and
            the kernels that take this one.
    """
    if acts_on is None or acts_on in kernel.accepts:
        return
    allowed = ", ".join(name for name, spec in POSITIONAL_SPECS.items()
                        if spec.acts_on is None or spec.acts_on in kernel.accepts)
    taking = " or ".join(repr(name) for name, spec in KERNELS.items() if acts_on in spec.accepts)
    why = _REFUSED.get(acts_on, "acts on {where}, which {attention} attention does not take")
    raise ValueError(f"{what} {why.format(where=acts_on, attention=kernel.name)}; with {kernel.name} choose one "
                     f"of {allowed}, or use attention {taking}")


def _check_positional(kernel, causal: bool, module: LayerEncoding | None) -> None:
    """The module's place accepted by the kernel (:func:`check_placement`) and a score term's
    causality the layer's (the kernel's own refusals: ``KernelSpec.check``)."""
    if module is None:
        return
    check_placement(kernel, module.acts_on, module.label)
    if module.forms_scores and getattr(module, "causal", causal) != causal:
        raise ValueError(f"the score encoding is {'' if module.causal else 'non-'}causal but the layer "
                         f"is {'' if causal else 'non-'}causal")


def _check_realizations(num_realizations, coded: bool) -> None:
    """R, if given, is a positive int and the R of the layer's SPE codes (so it needs a module that
    takes them)."""
    if num_realizations is None:
        return
    if isinstance(num_realizations, bool) or not isinstance(num_realizations, int) or num_realizations < 1:
        raise ValueError(f"num_realizations must be a positive int, got {num_realizations!r}")
    if not coded:
        raise ValueError(f"num_realizations ({num_realizations}) is the R of SPE codes, but this layer has no "
                         f"spe_filter: leave it out")


def _softmax_weights(q: Tensor, k: Tensor, options: KernelOptions, blocks: int | None = None) -> Tensor:
    """(B, H, L, L) softmax attention of q, k (B, L, H, E), formed explicitly with the score term,
    decay, causal mask, window and key padding of ``options`` (the softmax kernel's terms), and
    the mask of block-local attention of ``blocks`` positions a block."""
    term = options.score_term
    mask = options.key_padding_mask
    n = q.shape[1]
    oracle = term is not None and hasattr(term, "weights")  # the SPE oracle: its scores depend on the keys
    if oracle and blocks is None:
        return term.weights(q, k, key_padding_mask=mask).to(q.dtype)
    if oracle:
        scores = term.scores(q, k).to(q.dtype)
    else:
        scores = torch.einsum("bmhe,bnhe->bhmn", q, k) / math.sqrt(q.shape[-1])
    if term is not None and not oracle:  # Shaw, Music Transformer …: a term added to q·k/√D
        scores = scores + term.score_bias(q, n).to(scores.dtype)
    if options.decay is not None:
        scores = scores + _decay_logits(options.decay, q.shape, causal=options.causal).to(scores.dtype)
    i = torch.arange(n, device=q.device)
    lag = i[:, None] - i[None, :]
    visible = (lag >= 0) if options.causal else torch.ones_like(lag, dtype=torch.bool)
    if options.window is not None:
        visible = visible & (lag < options.window)
    if blocks is not None:
        visible = visible & block_keep(n, n, blocks, causal=options.causal, device=q.device)
    visible = visible[None, None]  # (1, 1, L, L)
    if mask is not None:
        visible = visible & check_key_padding_mask(mask, k)  # (B, 1, 1, L)
    return scores.masked_fill(~visible, -math.inf).softmax(dim=-1)


def _decay_logits(log_decay: Tensor, shape: torch.Size, *, causal: bool) -> Tensor:
    """(B, H, L, L) log w_mn of a decay (H,) or gate (B, L, H) on the logits: Σ_{n<t≤m} G_t (FoX's,
    :func:`~spe.ops.softmax.chunk.gate_bias`; −∞ after m) when causal, else the gates between m and n
    either way, −|F_m − F_n| with F their running sums (G ≤ 0). A constant decay is the gate λ_h.

    Raises:
        ValueError: for a gate per feature channel (B, L, H, M), which is no term of the logits.
    """
    if decay_form(log_decay) == "channel":
        raise ValueError("decay 'gated-channel' weighs each channel of φ(q̂)·φ(k̂) apart: it is no term of "
                         "softmax's logits, so its layers have no exact (softmax) weights")
    gates = softmax_gates(log_decay, tuple(shape))  # (B, L, H)
    if causal:
        return gate_bias(gates)
    f = gates.cumsum(dim=1).transpose(1, 2)  # (B, H, L)
    return -(f[..., :, None] - f[..., None, :]).abs()

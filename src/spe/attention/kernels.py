"""The attention kernels by spec: a plain dict from name to what the kernel is and accepts.

Letters: B = batch, L = length (Lq queries, Lk keys), H = num_heads, E = query/key dimension
(R with SPE), M = feature dimension (E for softmax), Ev = value dimension.

Every kernel runs the same pipeline, so :class:`~spe.attention.MultiHeadAttention` has one
path for ``forward``, one for ``step`` and one for ``prefill``:

1. **feature map** φ (:attr:`KernelSpec.feature_map`; None for softmax, whose "features"
   are the queries and keys themselves): ``(q, k, projection) -> (φ(q), φ(k), key log scale)``;
2. **feature transforms** (:class:`FeatureTransform`) by position, on φ(q), φ(k): RoPE today
   (softmax: rotated q and k; linear kernels: RoFormer eq. 19); the registry's feature
   encodings (``acts_on="features"``) are transforms of this kind (docs/conventions.md);
3. the kernel's **parallel** function ``(features, v, options) -> y``, its **step**
   function ``(features, v, state, options) -> (y, state)`` or its **prefill** function
   ``(features, v, options, state) -> (y, state)`` (a prompt at once, then steps), with
   :class:`KernelOptions` carrying what the call adds: causality, window, key padding mask, a **score term** (the
   registry's score encodings: Shaw, Music Transformer …; the SPE oracle, ``sinespe-exact``), a **decay** in one of the
   forms of :data:`DECAY_FORMS` (RetNet's constant γ^{|m−n|} on the kernel's sums,
   :mod:`spe.ops.decay`; a data-dependent gate per head and position, Mamba2's and FoX's,
   or per feature channel, GLA's, :mod:`spe.ops.decay.forms`; each spec's ``decays`` say which).

What a kernel accepts is declared in its spec and checked once (:meth:`KernelSpec.check`),
so an impossible pair raises the same ValueError wherever it is asked for.

``linear`` is normaliser-free (RetNet, GLA, fla's ``linear_attn``): identity features and
y_m = Σ_{n≤m} w_mn (q_m·k_n) v_n without a denominator (``normalize=False`` of the linear
ops). With SPE (q̂, k̂ of :class:`~spe.SPEFilter`, each scaled by (D·R)^{−1/4}, eq. (16)-(17))
E[q̂_m·k̂_n] = (R / √(D·R)) Σ_d q_d k_d P_d(m − n) = √(R/D) Σ_d q_d k_d P_d(m − n): the output
is √(R/D) times that of the exact relative kernel (exactly so, not only in expectation,
for ungated sineSPE with orthogonal noise and 2K·D ≤ R; gated, P_d becomes (1 − δ_d) P_d + δ_d).
Its spec says ``normalizer_free``, and the layer then applies a per-head RMS norm to its
output, which removes that factor (up to the norm's ε); a direct kernel call keeps it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from spe.ops.common.feature_maps import (
    elu_feature_map,
    favor_feature_map,
    favor_key_features,
    relu_feature_map,
)
from spe.ops.decay.forms import ChannelGate, ConstantDecay, ScalarGate, given_form
from spe.ops.linear_attn.chunk import unchecked_causal_linear_attention_with_state, unchecked_linear_attention
from spe.ops.linear_attn.options import kernel_dtype
from spe.ops.linear_attn.recurrent import unchecked_linear_attention_step
from spe.ops.softmax import check_key_padding_mask, softmax_attention
from spe.ops.softmax.recurrent import append_to_cache, prefill_cache, softmax_attention_step
from spe.ops.softmax.flex import check_softmax_impl, choose_softmax_impl, flex_softmax_attention, run_flex
from spe.ops.common.state import (
    KVCache,
    LinearAttentionState,
    RecentKeys,
    ScaledLinearAttentionState,
    ScaledRecentKeys,
)

__all__ = ["DECAY_FORMS", "KERNELS", "KERNEL_PLACES", "FeatureTransform", "KernelFeatures", "KernelOptions",
           "KernelSpec", "ScoreTerm", "decay_form", "kernel_features", "kernel_spec",
           "numerator_transform_kernels", "set_softmax_impl"]

# Where a positional encoding may act, as the positional registry names the places
# (spe.encodings.registry.PLACES): added to tokens, transforming queries/keys (RoPE: after a
# feature map, their features), a term in the scores (softmax), or a transform of the
# features φ (PermuteFormer …: linear kernels, softmax has no φ).
KERNEL_PLACES = ("tokens", "queries-keys", "scores", "features")
# The forms of KernelOptions.decay, by what the tensor holds, and how messages name them.
DECAY_FORMS = {ConstantDecay.name: "a decay", ScalarGate.name: "a gate per head and position",
               ChannelGate.name: "a gate per feature channel"}


def decay_form(log_decay: Tensor | None) -> str | None:
    """The :data:`DECAY_FORMS` key of a decay, the name of its form
    (:func:`spe.ops.decay.forms.given_form`): ``constant`` (H,), ``gate`` (B, L, H), ``channel``
    (B, L, H, M); None for None (or a shape the kernel's own check will refuse)."""
    form = given_form(log_decay)
    return None if form is None else form.name


class ScoreTerm(Protocol):
    """A module that forms softmax attention with its own term in the scores (Shaw, Music
    Transformer …, the SPE oracle): ``attend`` takes q (B, Lq, H, E), k (B, Lk, H, E),
    v (B, Lk, H, Ev), the position of the first query and, in non-causal layers, a (B, Lk)
    bool key padding mask (True at padding: those keys get no weight; passed only when there
    is one), and returns (B, Lq, H, Ev)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, query_offset: int = 0,
               key_padding_mask: Tensor | None = None) -> Tensor: ...


@dataclass(frozen=True)
class FeatureTransform:
    """A position-dependent transform of the kernel's features φ(q), φ(k).

    Attributes:
        apply: ``(features (B, L, H, M), positions (L,)) -> (B, L, H, M')``, in the kernel's
            dtype (at least float32).
        numerator_only: with a linear kernel, the normaliser keeps the untransformed
            features (RoPE, RoFormer eq. 19: the product may be negative), which needs
            strictly positive features (the spec's ``positive_features``); False: both are
            transformed alike (PermuteFormer). Softmax has no separate normaliser: its q, k are transformed.
        name: for error messages.
    """

    apply: Callable[[Tensor, Tensor], Tensor]
    numerator_only: bool = True
    name: str = "feature transform"


@dataclass(frozen=True)
class KernelFeatures:
    """What a kernel's parallel or step function receives for queries and keys.

    Attributes:
        q: (B, Lq, H, M) φ(q) after transforms (softmax: the queries).
        k: (B, Lk, H, M) φ(k) after transforms (FAVOR+: relative to ``key_log_scale``).
        normalizer: (queries, keys) features (B, L, H, M') of a separate normaliser, or None.
        key_log_scale: (B, Lk, H) a_n with φ(k_n) = k_n · e^{a_n} (FAVOR+), or None.
    """

    q: Tensor
    k: Tensor
    normalizer: tuple[Tensor, Tensor] | None = None
    key_log_scale: Tensor | None = None


@dataclass(frozen=True)
class KernelOptions:
    """What a call adds to the features.

    Attributes:
        causal: mask the future.
        window: W of causal sliding-window attention (None: the whole past).
        chunk_size: C of chunked causal linear attention.
        key_padding_mask: (B, Lk) bool, True at padding (non-causal ``parallel`` only).
        score_term: a :class:`ScoreTerm` (softmax only).
        decay: the log decay, one of :data:`DECAY_FORMS`: (H,) λ_h = log γ_h ≤ 0, the *log*
            of the per-head decay γ_h ∈ (0, 1] on the lag, y_m ∝ Σ γ^{|m−n|} φ(q_m)·φ(k_n) v_n
            (RetNet; :mod:`spe.ops.decay`); (B, L, H) a gate G_t ≤ 0 per head and position
            (Mamba2; softmax: FoX), key n weighing exp(Σ_{n<t≤m} G_t) at query m; or
            (B, L, H, M) a gate per feature channel of φ (GLA); None: none. Taken by the
            kernels whose ``KernelSpec.decays`` name its form.
        softmax_impl: softmax's parallel path, one of :data:`~spe.ops.softmax.flex.SOFTMAX_IMPLS`:
            ``auto`` (FlexAttention on CUDA for FoX's gate, a window and the score terms it
            takes, :mod:`spe.ops.softmax.flex`; the per-block form elsewhere), ``flex`` (asked for;
            falls back with a warning saying why where it cannot run) or ``blocks`` (the
            per-block form, the CPU's and the reference). Other kernels ignore it.
    """

    causal: bool = True
    window: int | None = None
    chunk_size: int = 64
    key_padding_mask: Tensor | None = None
    score_term: ScoreTerm | None = None
    decay: Tensor | None = None
    softmax_impl: str = "auto"


FeatureMap = Callable[[Tensor, Tensor, Tensor | None], tuple[Tensor, Tensor, Tensor | None]]
Parallel = Callable[[KernelFeatures, Tensor, KernelOptions], Tensor]
Step = Callable[[KernelFeatures, Tensor, Any, KernelOptions], tuple[Tensor, Any]]
Prefill = Callable[[KernelFeatures, Tensor, KernelOptions, Any], tuple[Tensor, Any]]


@dataclass(frozen=True)
class KernelSpec:
    """One attention kernel: its feature map, what it accepts, its parallel and step functions.

    Attributes:
        name: the string of configs and the command line.
        source: the reference.
        feature_map: ``(q, k, projection) -> (φ(q), φ(k), key log scale or None)``; None for
            softmax (explicit scores of q and k).
        parallel: ``(features, v (B, L, H, Ev), options) -> (B, L, H, Ev)``.
        step: ``(features, v (B, 1, H, Ev), state or None, options) -> ((B, 1, H, Ev), state)``,
            equal to ``parallel`` position by position.
        prefill: ``(features, v (B, L, H, Ev), options, state or None) -> ((B, L, H, Ev),
            state)``, causal: ``parallel``'s output and the state ``step`` would hold after
            these L positions (a prompt in one parallel pass instead of L steps), going on
            from ``state`` (None: the start; linear kernels only, differentiable: state passing).
        state_types: the decoding states ``step`` takes and returns (the first: the one for
            the whole past, also what old dict states convert to).
        accepts: the places (``KERNEL_PLACES``) where a positional encoding may act.
        masks: takes key padding masks (non-causal).
        windows: takes causal sliding windows.
        feature_transforms: takes :class:`FeatureTransform` s.
        decays: the forms of ``KernelOptions.decay`` (:data:`DECAY_FORMS`) it takes in causal
            layers.
        encoder_decays: those it takes when not causal (None: ``decays``; softmax's FoX gate
            is causal only).
        key_scales: φ(k) comes as features and a log scale (FAVOR+: no overflow at any R).
        random_features: draws random projections (``num_features`` of them; redrawable).
        positive_features: φ > 0 everywhere (numerator-only transforms need it).
        normalizer_features: normalises by Σ φ(q)ᵀφ(k) from its features (linear kernels),
            so numerator-only transforms keep a separate, untransformed normaliser.
        normalizer_free: its output is the numerator alone, unnormalised (``linear``): the
            layer applies a per-head RMS norm to it.
    """

    name: str
    source: str
    feature_map: FeatureMap | None
    parallel: Parallel
    step: Step
    prefill: Prefill
    state_types: tuple[type, ...]
    accepts: tuple[str, ...] = ("tokens", "queries-keys", "features")
    masks: bool = True
    windows: bool = True
    feature_transforms: bool = True
    decays: tuple[str, ...] = ()
    encoder_decays: tuple[str, ...] | None = None
    key_scales: bool = False
    random_features: bool = False
    positive_features: bool = False
    normalizer_features: bool = True
    normalizer_free: bool = False

    @property
    def score_terms(self) -> bool:
        """Takes a score term (it forms explicit scores)."""
        return "scores" in self.accepts

    @property
    def decay(self) -> bool:
        """Takes RetNet's constant decay (H,) (the linear kernels)."""
        return "constant" in self.decays

    @property
    def numerator_transforms(self) -> bool:
        """Takes numerator-only transforms (RoPE …): its features are strictly positive where
        a normaliser keeps them untransformed, or it has no normaliser (softmax, ``linear``)."""
        return self.positive_features or not self.normalizer_features

    def takes_decay(self, form: str, *, causal: bool = True) -> bool:
        """Whether it takes a decay of ``form`` (a :data:`DECAY_FORMS` key) in a causal layer or not."""
        return form in (self.decays if causal or self.encoder_decays is None else self.encoder_decays)

    def check(self, options: KernelOptions, *, transform: FeatureTransform | None = None) -> None:
        """Raises ValueError naming what this kernel does not accept in ``options`` (or ``transform``)."""
        form = decay_form(options.decay)
        refused = [what for what, given, taken in (
            ("a score term", options.score_term is not None, self.score_terms),
            ("a sliding window", options.window is not None, self.windows),
            ("a key padding mask", options.key_padding_mask is not None, self.masks),
            (DECAY_FORMS.get(form, "a decay") + ("" if options.causal else " when not causal"),
             options.decay is not None, form is not None and self.takes_decay(form, causal=options.causal)),
            ("a feature transform", transform is not None, self.feature_transforms)) if given and not taken]
        if refused:
            raise ValueError(f"{self.name} attention does not take {refused[0]}")
        if options.score_term is not None and options.decay is not None:
            raise ValueError(f"{self.name} attention does not take {DECAY_FORMS[form]} together with a score "
                             f"term, which forms the scores itself")
        if transform is not None and transform.numerator_only:
            self.check_numerator_transform(transform.name)

    def check_numerator_transform(self, name: str) -> None:
        """Raises ValueError if a transform of the numerator only (``name``: RoPE …) cannot
        run on this kernel: ReLU features can make the untransformed normaliser exactly 0 while
        the transformed numerator is not (RoFormer eq. 19 needs strictly positive features)."""
        if not self.numerator_transforms:
            raise ValueError(f"{name} with linear attention needs strictly positive features: use "
                             f"{' or '.join(numerator_transform_kernels())}, not {self.name}")

    def features(self, q: Tensor, k: Tensor, projection: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """(φ(q), φ(k), key log scale or None); q, k unchanged for softmax."""
        return (q, k, None) if self.feature_map is None else self.feature_map(q, k, projection)


def kernel_features(spec: KernelSpec, q: Tensor, k: Tensor, *, projection: Tensor | None = None,
                    transform: FeatureTransform | None = None, positions: Tensor | None = None) -> KernelFeatures:
    """Steps 1 and 2 of the pipeline: φ, then the transform at ``positions`` (L,).

    Args:
        spec: the kernel.
        q: (B, Lq, H, E) queries; k: (B, Lk, H, E) keys.
        projection: (H, M, E) random features (``spec.random_features``).
        transform: applied in at least float32 (bf16 cos/sin are coarse); numerator-only
            transforms of a kernel with ``normalizer_features`` keep the untransformed
            features as the normaliser.
        positions: (L,) positions of the transform.
    """
    fq, fk, log_scale = spec.features(q, k, projection)
    if transform is None:
        return KernelFeatures(fq, fk, key_log_scale=log_scale)
    dtype = kernel_dtype(fq, fk)
    fq, fk = fq.to(dtype), fk.to(dtype)
    normalizer = (fq, fk) if transform.numerator_only and spec.normalizer_features else None
    return KernelFeatures(transform.apply(fq, positions), transform.apply(fk, positions), normalizer, log_scale)


def _softmax_parallel(f: KernelFeatures, v: Tensor, o: KernelOptions) -> Tensor:
    if choose_softmax_impl(o.softmax_impl, f.q, f.k, v, log_decay=o.decay, score_term=o.score_term,
                           window=o.window) == "flex":
        extra = {} if o.score_term is None else o.score_term.flex_arguments(f.q)
        out = run_flex(o.softmax_impl, lambda: flex_softmax_attention(
            f.q, f.k, v, **{"causal": o.causal, "window": o.window, "key_padding_mask": o.key_padding_mask,
                            "log_decay": o.decay, **extra}))
        if out is not None:
            return out
    if o.score_term is not None:
        if o.key_padding_mask is not None:
            check_key_padding_mask(o.key_padding_mask, f.k)
        return o.score_term.attend(f.q, f.k, v, key_padding_mask=o.key_padding_mask)
    return softmax_attention(f.q, f.k, v, causal=o.causal, window=o.window,
                             key_padding_mask=o.key_padding_mask, log_decay=o.decay)


def _softmax_step(f: KernelFeatures, v: Tensor, state: KVCache | None, o: KernelOptions) -> tuple[Tensor, KVCache]:
    if callable(getattr(o.score_term, "step", None)):  # a score term with its own cache (PaTH)
        return o.score_term.step(f.q, f.k, v, state)
    if o.score_term is not None:  # the score term attends over the cache from the new query's position
        cache = append_to_cache(state, f.k, v, window=o.window)
        return o.score_term.attend(f.q, cache.keys, cache.values, query_offset=cache.position - 1), cache
    return softmax_attention_step(f.q, f.k, v, state, window=o.window, log_decay=o.decay)


def _softmax_prefill(f: KernelFeatures, v: Tensor, o: KernelOptions,
                     state: KVCache | None = None) -> tuple[Tensor, KVCache]:
    if state is not None:  # the parallel pass has no query offset into a cache
        raise ValueError("softmax attention prefills from the start only: go on from a KV cache with step")
    if callable(getattr(o.score_term, "prefill", None)):  # a score term with its own cache (PaTH)
        return o.score_term.prefill(f.q, f.k, v)
    return _softmax_parallel(f, v, o), prefill_cache(f.k, v, window=o.window, log_decay=o.decay)


def _linear_prefill(f: KernelFeatures, v: Tensor, o: KernelOptions, state=None, *,
                    normalize: bool = True) -> tuple[Tensor, Any]:
    return unchecked_causal_linear_attention_with_state(f.q, f.k, v, chunk_size=o.chunk_size, window=o.window,
                                              normalizer=f.normalizer, key_log_scale=f.key_log_scale,
                                              log_decay=o.decay, normalize=normalize, initial_state=state)


def _linear_parallel(f: KernelFeatures, v: Tensor, o: KernelOptions, *, normalize: bool = True) -> Tensor:
    if o.causal:
        return _linear_prefill(f, v, o, normalize=normalize)[0]
    return unchecked_linear_attention(f.q, f.k, v, key_padding_mask=o.key_padding_mask, normalizer=f.normalizer,
                            key_log_scale=f.key_log_scale, log_decay=o.decay, chunk_size=o.chunk_size,
                            normalize=normalize)


def _linear_step(f: KernelFeatures, v: Tensor, state, o: KernelOptions, *, normalize: bool = True):
    return unchecked_linear_attention_step(f.q, f.k, v, state, window=o.window, normalizer=f.normalizer,
                                 key_log_scale=f.key_log_scale, log_decay=o.decay, normalize=normalize)


def _identity(x: Tensor) -> Tensor:
    """φ(x) = x: the features of normaliser-free linear attention (``linear``)."""
    return x


def _elementwise(fmap: Callable[[Tensor], Tensor]) -> FeatureMap:
    def features(q: Tensor, k: Tensor, projection: Tensor | None) -> tuple[Tensor, Tensor, None]:
        return fmap(q), fmap(k), None

    features.__name__ = fmap.__name__
    return features


def favor_features(q: Tensor, k: Tensor, projection: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """FAVOR+ features: queries stabilised by their own maximum, keys with their log scale apart
    (no clamp, no overflow; :func:`~spe.ops.common.feature_maps.favor_key_features`)."""
    if projection is None:
        raise ValueError("performer attention needs its random projection (H, M, E)")
    keys = favor_key_features(k, projection)
    return favor_feature_map(q, projection, is_query=True), keys.features, keys.log_scale


_LINEAR_STATES = (LinearAttentionState, RecentKeys)
_ALL_DECAYS = tuple(DECAY_FORMS)
# The numerator alone (the linear ops' normalize=False), for the normaliser-free kernel.
_UNNORMALISED = [functools.partial(fn, normalize=False)
                 for fn in (_linear_parallel, _linear_step, _linear_prefill)]

KERNELS: dict[str, KernelSpec] = {spec.name: spec for spec in (
    KernelSpec("softmax", "exact, O(L²) (Vaswani et al. 2017)", None, _softmax_parallel, _softmax_step,
               _softmax_prefill, (KVCache,), accepts=("tokens", "queries-keys", "scores"),
               positive_features=True, normalizer_features=False, decays=("gate",), encoder_decays=()),
    # a channel gate would need a FAVOR+ key log scale per channel (spe.ops.decay.forms.check_gates)
    KernelSpec("performer", "FAVOR+ positive orthogonal random features (Choromanski et al. 2021)",
               favor_features, _linear_parallel, _linear_step, _linear_prefill,
               (ScaledLinearAttentionState, ScaledRecentKeys),
               decays=("constant", "gate"), key_scales=True, random_features=True, positive_features=True),
    KernelSpec("linear-relu", "φ = relu (Katharopoulos et al. 2020)", _elementwise(relu_feature_map),
               _linear_parallel, _linear_step, _linear_prefill, _LINEAR_STATES, decays=_ALL_DECAYS),
    KernelSpec("linear-elu", "φ = elu + 1 (Katharopoulos et al. 2020)", _elementwise(elu_feature_map),
               _linear_parallel, _linear_step, _linear_prefill, _LINEAR_STATES, decays=_ALL_DECAYS,
               positive_features=True),
    KernelSpec("linear", "φ = identity, no normaliser, RMS norm per head (RetNet; GLA; fla's linear_attn)",
               _elementwise(_identity), *_UNNORMALISED, _LINEAR_STATES, decays=_ALL_DECAYS,
               normalizer_features=False, normalizer_free=True),
)}


def set_softmax_impl(module, impl: str) -> int:
    """Sets ``softmax_impl`` (:class:`KernelOptions`) on every attention layer in ``module``
    (a model or a layer) and returns how many it set.

    Raises:
        ValueError: on an unknown ``impl`` (:func:`~spe.ops.softmax.flex.check_softmax_impl`).
    """
    check_softmax_impl(impl)
    layers = [m for m in module.modules() if hasattr(m, "softmax_impl") and hasattr(m, "kernel")]
    for layer in layers:
        layer.softmax_impl = impl
    return len(layers)


def numerator_transform_kernels() -> list[str]:
    """The linear kernels that take numerator-only transforms (:attr:`KernelSpec.numerator_transforms`)."""
    return [s.name for s in KERNELS.values() if s.feature_map is not None and s.numerator_transforms]


def kernel_spec(name: str) -> KernelSpec:
    """The registry entry of ``name``.

    Raises:
        ValueError: if ``name`` is not registered (the message lists the registered names).
    """
    try:
        return KERNELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown attention {name!r}; choose one of {', '.join(KERNELS)}") from None

"""The options every model trunk shares, validated once (:class:`TrunkConfig`).

The language model's :class:`~spe.models.ModelConfig` and the classifier's
:class:`~spe.models.ClassifierConfig` extend :class:`TrunkConfig` with their own options and
checks; neither refuses an option of the base, and the base never reads a subclass's fields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import ClassVar, Self

from spe.attention.kernels import kernel_spec
from spe.attention.layer import ACCEPTS, ATTENTIONS, check_decay
from spe.encodings.filter import IMPLS as SPE_IMPLS
from spe.encodings.lrpe import LRPE_ANGLES
from spe.encodings.positions import require_positive
from spe.encodings.registry import POSITIONAL_SPECS, positional_names, positional_spec
from spe.encodings.short_conv import check_short_conv
from spe.encodings.sine import CODE_NOISES, FREQUENCY_INITS
from spe.ops.decay import NO_DECAY

__all__ = ["POSITIONALS", "SCORE_ENCODINGS", "TrunkConfig"]

# Each positional encoding and where it acts (the registry's view; see spe.attention.layer.ACCEPTS).
POSITIONALS = {name: spec.acts_on for name, spec in POSITIONAL_SPECS.items()}
SCORE_ENCODINGS = positional_names(acts_on="scores")
# Why a kernel refuses an encoding, by where the encoding acts.
_REFUSED = {"scores": "adds a term to the attention scores, which {attention} attention never forms",
            "features": "transforms the features φ(q), φ(k) of a linear kernel, which {attention} attention "
                        "does not have"}


@dataclass
class TrunkConfig:
    """Embedding, positional encoding and Transformer blocks: what every model is made of.

    Attributes:
        vocab_size: number of token ids.
        d_model: embedding size C.
        num_layers: Transformer blocks.
        num_heads: H; head_dim = d_model / num_heads.
        d_ff: hidden size of the feed-forward block.
        dropout: dropout probability in residual branches, in [0, 1).
        positional: one of ``POSITIONALS``: added to tokens ``ape`` (sinusoidal) or
            ``ape-learned``; on queries and keys ``sinespe``, ``convspe``, ``convspe-2d``,
            ``rope``; in the scores (softmax attention only) ``shaw``, ``music-relative``,
            ``alibi``; on the kernel's features φ (linear kernels only) ``lrpe``
            (performer or linear-elu), ``permute`` (PermuteFormer), ``cosformer``; or
            ``none``. Which of them a model takes is its own config's rule.
        attention: ``softmax``, ``performer``, ``linear-relu``, ``linear-elu`` or ``linear``
            (normaliser-free: identity features, no denominator, a per-head RMS norm of the
            output; RetNet, GLA, fla's ``linear_attn``).
        gated: SPE gating (eq. 23-25), for ``sinespe``/``convspe``. Off by default: on the
            Bach chorales ungated sineSPE was better than gated in every position bucket
            (docs/ablation.md).
        num_realizations: R for SPE.
        num_sines: K for ``sinespe``.
        kernel_size: P (positions) for ``convspe``.
        frequency_init: ``low`` or ``spread`` initial sineSPE frequencies.
        code_noise: ``gaussian`` or ``orthogonal`` (variance-reduced) sineSPE noise.
        gate_init: initial gate logit (δ = sigmoid(gate_init)).
        share_across_layers: one SPE (parameters and code) for all layers, as in the paper
            (each layer keeps its own gate); False gives every layer its own ``sinespe`` or
            ``convspe`` module and its own noise draw.
        num_features: FAVOR+ random features M.
        chunk_size: chunk length of causal linear attention.
        code_seed: seed of the SPE code in eval mode (same checkpoint + input = same outputs).
        fixed_code: draw the SPE code from ``code_seed`` in training too, so that every step
            (and evaluation) sees the same code, instead of a fresh draw per step. A fresh
            code re-randomises the R coordinates of q̂, k̂ at every step, which a kernel with
            fixed random features (FAVOR+) cannot adapt to (docs/lra.md, the ListOps study).
        max_positions: number of ``ape-learned`` embeddings (longer inputs raise ValueError).
        rope_base: ``rope`` frequency base.
        spe_impl: how ``sinespe`` codes are applied (same numbers either way; see
            :class:`~spe.SPEFilter` and docs/bench.md): ``auto`` (default: materialised while
            the (L, H, D, R) code has at most 2^24 elements, else fused or blocked by a cost
            model), ``materialized`` (fastest at short lengths, holds the code and its
            gradient), ``blocked`` (the batch-shared code formed per block of positions, in
            forward and again in backward: the least memory), ``fused`` or ``reference``.
        lrpe_angles: ``lrpe`` angles θ_d: ``fixed`` at base^(−d/M) (10,000, no parameter) or
            ``learned`` (an (H, M) parameter per layer, initialised there).
        permute_seed: seed of the ``permute`` permutations (drawn once, kept in the state
            dict; every layer gets the same ones, as in PermuteFormer's code).
        cosformer_max_length: L_max of ``cosformer``, which attends only within L_max
            positions (a position ≥ L_max raises ValueError); None: ``max_positions``.
        decay: one of ``DECAY_MODES``: ``none`` (default), ``fixed`` (RetNet's γ_h = 1 −
            2^(−5−h) per head on the lag, weights γ^{|m−n|}) or ``learned`` (γ_h =
            sigmoid(logit_h) initialised there, one (H,) parameter per layer), linear kernels
            only (:mod:`spe.ops.decay`); or a forget gate from each layer's input, key n
            weighing exp(Σ_{n<t≤m} G_t) at query m (:mod:`spe.encodings.gates`): ``gated``,
            one per head and position (Mamba2's −softplus(wᵀx + b)·exp(A_log), starting at
            RetNet's fixed decays), every kernel (with softmax it is FoX: decoders only, no
            score encoding; ``none`` is FoX's own positional choice), ``gated-channel``, one
            per feature channel (GLA's logsigmoid(W₂W₁x)/16, rank 16), linear kernels but
            performer, no feature transform (RoPE: tied over rotated pairs). Decays and gates
            act on the kernel's sums, so they compose with every queries-keys encoding
            (``rope`` + ``fixed`` is RetNet's scheme); gate parameters are positional (never
            weight-decayed).
        short_conv: K, a depthwise convolution of width K then SiLU on each layer's projected
            queries, keys and values (fla's ``ShortConvolution``, K = 4 there), before SPE,
            RoPE and the feature maps: causal in decoders, which then carry the last K − 1
            projected inputs when decoding, centred in encoders
            (:mod:`spe.encodings.short_conv`). 0 (default): none. With every encoding and
            kernel; its weights are positional parameters (never weight-decayed).

    Class attributes:
        causal: whether the trunk's blocks mask the future (the registry builds encoder
            variants, e.g. convSPE's centred filter, when False). Set by each model's config.

    Raises:
        ValueError: naming the option and the value received, for an unknown encoding or
            kernel, an encoding the kernel cannot take, a size that is not a positive
            integer, ``d_model`` not divisible by ``num_heads``, a dropout outside [0, 1), an
            unknown ``decay`` or one the kernel or encoding does not take
            (:func:`spe.attention.layer.check_decay`), a ``short_conv`` that is not 0 or an
            integer ≥ 2.
    """

    causal: ClassVar[bool] = True

    vocab_size: int
    d_model: int = 256
    num_layers: int = 4
    num_heads: int = 4
    d_ff: int = 1024
    dropout: float = 0.1
    positional: str = "sinespe"
    attention: str = "performer"
    gated: bool = False
    num_realizations: int = 32
    num_sines: int = 5
    kernel_size: int = 64
    frequency_init: str = "low"
    code_noise: str = "gaussian"
    gate_init: float = 0.0
    share_across_layers: bool = True
    num_features: int = 64
    chunk_size: int = 64
    code_seed: int = 0
    fixed_code: bool = False
    max_positions: int = 2048
    rope_base: float = 10000.0
    spe_impl: str = "auto"
    lrpe_angles: str = "fixed"
    permute_seed: int = 0
    cosformer_max_length: int | None = None
    decay: str = "none"
    short_conv: int = 0

    def __post_init__(self) -> None:
        if self.positional not in POSITIONALS:
            raise ValueError(f"unknown positional encoding {self.positional!r}; "
                             f"choose one of {', '.join(POSITIONALS)}")
        kernel = kernel_spec(self.attention)  # the registry's own "unknown attention" error
        where = POSITIONALS[self.positional]
        if where is not None and where not in ACCEPTS[self.attention]:
            allowed = ", ".join(p for p, w in POSITIONALS.items() if w is None or w in ACCEPTS[self.attention])
            taking = " or ".join(repr(a) for a in ATTENTIONS if where in ACCEPTS[a])
            what = _REFUSED.get(where, "acts on {where}, which {attention} attention does not take")
            raise ValueError(f"positional {self.positional!r} "
                             f"{what.format(where=where, attention=self.attention)}; with {self.attention} "
                             f"choose one of {allowed}, or use attention {taking}")
        if POSITIONAL_SPECS[self.positional].positive_features:
            kernel.check_numerator_transform(f"positional {self.positional!r}")
        require_positive(type(self).__name__, **{name: getattr(self, name) for name in (
            "vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "num_realizations",
            "num_sines", "kernel_size", "num_features", "chunk_size", "max_positions")})
        self._check_feature_options()
        if self.spe_impl not in SPE_IMPLS:
            raise ValueError(f"spe_impl must be one of {', '.join(SPE_IMPLS)}, got {self.spe_impl!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        self._check_decay()
        check_short_conv(self.short_conv)

    def _check_decay(self) -> None:
        where = POSITIONALS[self.positional]
        named = f"positional {self.positional!r}"
        check_decay(kernel_spec(self.attention), self.decay, causal=self.causal,
                    score_encoding=named if where == "scores" else None,
                    feature_transform=named if where == "features" else None)

    def _check_feature_options(self) -> None:
        for name, allowed in (("code_noise", CODE_NOISES), ("frequency_init", FREQUENCY_INITS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.lrpe_angles not in LRPE_ANGLES:
            raise ValueError(f"lrpe_angles must be one of {', '.join(LRPE_ANGLES)}, got {self.lrpe_angles!r}")
        if isinstance(self.permute_seed, bool) or not isinstance(self.permute_seed, int):
            raise ValueError(f"permute_seed must be an integer, got {self.permute_seed!r}")
        if self.cosformer_max_length is not None:
            require_positive(type(self).__name__, cosformer_max_length=self.cosformer_max_length)
            self.cosformer_max_length = int(self.cosformer_max_length)

    @property
    def feature_dim(self) -> int:
        """M, the kernel's feature dimension that feature transforms act on: ``num_features``
        with random features (performer), head_dim otherwise."""
        return self.num_features if kernel_spec(self.attention).random_features else self.d_model // self.num_heads

    @property
    def position_limit(self) -> int | None:
        """The most positions a model of this config takes (its encoding's
        :meth:`~spe.encodings.spec.PositionalSpec.max_positions`: learned embeddings,
        cosFormer's L_max); None: any length."""
        return positional_spec(self.positional).max_positions(self)

    def to_dict(self) -> dict:
        """The options as a JSON-serialisable dict (what checkpoint headers store). ``decay`` is
        left out when it is ``none``, ``short_conv`` when 0 and ``fixed_code`` when False, so
        headers of models without them stay as they were (and load with those defaults)."""
        values = asdict(self)
        if values["decay"] == NO_DECAY:
            del values["decay"]
        if not values["short_conv"]:
            del values["short_conv"]
        if not values["fixed_code"]:
            del values["fixed_code"]
        return values

    @classmethod
    def from_dict(cls, values: dict) -> Self:
        """Builds a config, ignoring unknown keys (checkpoints from newer versions, or options
        another model's config has: e.g. a classifier header written with the language
        model's ``attention_window``)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

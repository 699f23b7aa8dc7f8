"""The options every model trunk shares, validated once (:class:`TrunkConfig`).

The language model's :class:`~spe.models.ModelConfig` and the classifier's
:class:`~spe.models.ClassifierConfig` extend :class:`TrunkConfig` with their own options and
checks; neither refuses an option of the base, and the base never reads a subclass's fields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import ClassVar, Self

from spe.attention.fourier import MIXERS, check_mixer
from spe.attention.kernels import KERNELS, kernel_spec
from spe.attention.layer import check_attention_blocks, check_decay, check_placement
from spe.attention.pro import PRO_OPTIONS, check_pro_options
from spe.encodings.positions import require_positive
from spe.encodings.registry import ENCODING_OPTIONS, POSITIONAL_SPECS, positional_names, positional_spec
from spe.encodings.short_conv import check_short_conv
from spe.ops.decay import NO_DECAY

__all__ = ["POSITIONALS", "SCORE_ENCODINGS", "TrunkConfig"]

# Each positional encoding and where it acts (the registry's view; see spe.attention.layer.ACCEPTS).
POSITIONALS = {name: spec.acts_on for name, spec in POSITIONAL_SPECS.items()}
SCORE_ENCODINGS = positional_names(acts_on="scores")


@dataclass
class TrunkConfig(*ENCODING_OPTIONS):
    """Embedding, positional encoding and Transformer blocks: what every model is made of.

    Attributes:
        vocab_size: number of token ids.
        d_model: embedding size C.
        num_layers: Transformer blocks.
        num_heads: H; head_dim = d_model / num_heads.
        d_ff: hidden size of the feed-forward block.
        dropout: dropout probability in residual branches, in [0, 1).
        positional: one of ``POSITIONALS``, the registry's names
            (:func:`spe.encodings.registry.positional_help` groups them by where they act:
            tokens, queries and keys, softmax's scores, a linear kernel's features), or
            ``none``. The kernel must accept where it acts (``ACCEPTS``); which encodings a
            model takes is its own config's rule.
        attention: ``softmax``, ``performer``, ``linear-relu``, ``linear-elu`` or ``linear``
            (normaliser-free: identity features, no denominator, a per-head RMS norm of the
            output; RetNet, GLA, fla's ``linear_attn``); or a mixer in the attention's place
            (:data:`spe.attention.fourier.MIXERS`): ``fnet`` in encoders, ``fnet-causal`` in
            decoders, with encodings on tokens only and none of attention's options.
        (each encoding's options): the fields of every options class the registry lists
            (:data:`spe.encodings.registry.ENCODING_OPTIONS`), declared and checked in the
            encoding's own file (``num_realizations``, ``gated`` … in
            :class:`~spe.encodings.filter.SPEOptions`, ``num_sines`` in
            :class:`~spe.encodings.sine.SineOptions`, ``kernel_size``, ``max_positions``,
            ``max_distance``, ``rope_base`` …): keyword-only, flat in config files and
            checkpoint headers.
        num_features: FAVOR+ random features M.
        chunk_size: chunk length of causal linear attention.
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
        output_gate, qk_norm, kv_shift, output_norm: FoX-Pro's block in every layer
            (:mod:`spe.attention.pro`, Lin et al. 2025), each False by default: an output gate
            y ⊙ sigmoid(W_o x) per channel before the output projection; RMS-normalised queries
            and keys per head with a learnable (H, D) scale, ε = 1e-5, before the positional
            encoding; a data-dependent token shift k'_t = α_t k_{t−1} + (1 − α_t) k_t, α_t =
            sigmoid(wᵀx_t) per head (v likewise, its own w), whose decoding carries the previous
            keys and values; the per-head RMS norm of the attention output (``linear`` always
            has it). With every kernel, encoding and decay; FoX-Pro is ``attention = "softmax"``,
            ``decay = "gated"``, ``positional = "none"`` and all four.
        attention_blocks: N, the Music Transformer's block-local attention in every layer
            (Huang et al. 2018, after Liu et al. 2018; :mod:`spe.ops.softmax.local`): blocks of
            N positions, each query attends to its own block (causally in a decoder) and to the
            whole previous one; memory O(L·N), decoding keeps at most 2N keys. Softmax only,
            with every encoding but PaTH (score encodings see relative distances up to 2N − 1);
            not with a decay, nor with a sliding window. 0 (default): off.

    Class attributes:
        causal: whether the trunk's blocks mask the future (the registry builds encoder
            variants, e.g. convSPE's centred filter, when False). Set by each model's config.

    Raises:
        ValueError: naming the option and the value received, for an unknown encoding or
            kernel, an encoding the kernel cannot take, a size that is not a positive
            integer, ``d_model`` not divisible by ``num_heads``, a dropout outside [0, 1), an
            unknown ``decay`` or one the kernel or encoding does not take
            (:func:`spe.attention.layer.check_decay`), a ``short_conv`` that is not 0 or an
            integer ≥ 2, a FoX-Pro option that is not a bool.
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
    num_features: int = 64
    chunk_size: int = 64
    decay: str = "none"
    short_conv: int = 0
    output_gate: bool = False
    qk_norm: bool = False
    kv_shift: bool = False
    output_norm: bool = False
    attention_blocks: int = 0

    def __post_init__(self) -> None:
        if self.positional not in POSITIONALS:
            raise ValueError(f"unknown positional encoding {self.positional!r}; "
                             f"choose one of {', '.join(POSITIONALS)}")
        if self.attention in MIXERS:  # FNet: no queries, keys or kernel
            return self._check_mixer()
        if self.attention not in KERNELS:
            raise ValueError(f"unknown attention {self.attention!r}; choose one of {', '.join([*KERNELS, *MIXERS])}")
        kernel = kernel_spec(self.attention)
        check_placement(kernel, POSITIONALS[self.positional], f"positional {self.positional!r}")
        if not self.causal and POSITIONAL_SPECS[self.positional].causal_only:
            raise ValueError(f"positional {self.positional!r} is causal only: {type(self).__name__} is an encoder "
                             f"(not causal); use it in a decoder")
        if POSITIONAL_SPECS[self.positional].positive_features:
            kernel.check_numerator_transform(f"positional {self.positional!r}")
        require_positive(type(self).__name__, **{name: getattr(self, name) for name in (
            "vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "num_features", "chunk_size")})
        self._check_shared()
        self._check_decay()
        check_short_conv(self.short_conv)
        check_pro_options(**{name: getattr(self, name) for name in PRO_OPTIONS})
        self._check_blocks()

    def _check_blocks(self, window: int | None = None) -> None:
        """``attention_blocks``: 0 or a positive int, and what it combines with
        (:func:`~spe.attention.layer.check_attention_blocks`)."""
        if isinstance(self.attention_blocks, bool) or not isinstance(self.attention_blocks, int) \
                or self.attention_blocks < 0:
            raise ValueError(f"attention_blocks must be 0 (off) or a positive number of positions, got "
                             f"{self.attention_blocks!r}")
        if not self.attention_blocks:
            return
        spec = POSITIONAL_SPECS[self.positional]
        # the module's class says whether its scores are of the distance alone (PaTH's are not)
        module = spec.build_layer_module(self, causal=self.causal) if spec.acts_on == "scores" else None
        check_attention_blocks(kernel_spec(self.attention), self.attention_blocks, window=window,
                               decay=self.decay, positional=module)

    def _check_shared(self) -> None:
        for options in ENCODING_OPTIONS:  # every encoding's own checks, whichever encoding is chosen
            options.check_options(self)
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    def _check_mixer(self) -> None:
        """A mixer's model (:func:`spe.attention.fourier.check_mixer`: tokens-only encodings, none of
        attention's options), then the sizes and encoding options every model checks."""
        check_mixer(self, causal=self.causal)
        require_positive(type(self).__name__, **{name: getattr(self, name) for name in (
            "vocab_size", "d_model", "num_layers", "num_heads", "d_ff")})
        self._check_shared()

    def _check_decay(self) -> None:
        where = POSITIONALS[self.positional]
        named = f"positional {self.positional!r}"
        check_decay(kernel_spec(self.attention), self.decay, causal=self.causal,
                    score_encoding=named if where == "scores" and not POSITIONAL_SPECS[self.positional].takes_gate
                    else None,
                    feature_transform=named if where == "features" else None)

    @property
    def feature_dim(self) -> int:
        """M, the kernel's feature dimension that feature transforms act on: ``num_features``
        with random features (performer), head_dim otherwise."""
        random = self.attention in KERNELS and kernel_spec(self.attention).random_features
        return self.num_features if random else self.d_model // self.num_heads

    @property
    def position_limit(self) -> int | None:
        """The most positions a model of this config takes (its encoding's
        :meth:`~spe.encodings.spec.PositionalSpec.max_positions`, e.g. the number of learned
        embeddings); None: any length."""
        return positional_spec(self.positional).max_positions(self)

    def to_dict(self) -> dict:
        """The options as a JSON-serialisable dict (what checkpoint headers store). ``decay`` is
        left out when it is ``none``, ``short_conv`` and ``attention_blocks`` when 0, ``fixed_code``
        and FoX-Pro's options when False, so headers of models without them stay as they were
        (and load with those defaults)."""
        values = asdict(self)
        if values["decay"] == NO_DECAY:
            del values["decay"]
        for name in ("short_conv", "attention_blocks"):
            if not values[name]:
                del values[name]
        for name in ("fixed_code", *PRO_OPTIONS):
            if not values[name]:
                del values[name]
        return values

    @classmethod
    def from_dict(cls, values: dict) -> Self:
        """Builds a config, ignoring unknown keys (checkpoints from newer versions, or options
        another model's config has: e.g. a classifier header written with the language
        model's ``attention_window``)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

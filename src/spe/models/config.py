"""Model configuration: every component is chosen by a string."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from spe.attention.layer import ATTENTIONS
from spe.encodings.positions import require_positive

__all__ = ["POSITIONALS", "ModelConfig"]

POSITIONALS = ("ape", "sinespe", "convspe", "none")


@dataclass
class ModelConfig:
    """Decoder-only language model configuration.

    Attributes:
        vocab_size: number of token ids.
        d_model: embedding size C.
        num_layers: Transformer blocks.
        num_heads: H; head_dim = d_model / num_heads.
        d_ff: hidden size of the feed-forward block.
        dropout: dropout probability in residual branches.
        positional: ``ape`` (sinusoidal, added to tokens), ``sinespe``, ``convspe`` or ``none``.
        attention: ``softmax``, ``performer``, ``linear-relu`` or ``linear-elu``.
        gated: SPE gating (eq. 23-25), for ``sinespe``/``convspe``.
        num_realizations: R for SPE.
        num_sines: K for ``sinespe``.
        kernel_size: P (positions) for ``convspe``.
        frequency_init: ``low`` or ``spread`` initial sineSPE frequencies.
        code_noise: ``gaussian`` or ``orthogonal`` (variance-reduced) sineSPE noise.
        gate_init: initial gate logit (δ = sigmoid(gate_init)).
        num_features: FAVOR+ random features M.
        chunk_size: chunk length of causal linear attention.
        tie_embeddings: share the token embedding with the output layer.
        code_seed: seed of the SPE code in eval mode (same checkpoint + input = same logits).
    """

    vocab_size: int
    d_model: int = 256
    num_layers: int = 4
    num_heads: int = 4
    d_ff: int = 1024
    dropout: float = 0.1
    positional: str = "sinespe"
    attention: str = "performer"
    gated: bool = True
    num_realizations: int = 32
    num_sines: int = 5
    kernel_size: int = 64
    frequency_init: str = "low"
    code_noise: str = "gaussian"
    gate_init: float = 0.0
    num_features: int = 64
    chunk_size: int = 64
    tie_embeddings: bool = True
    code_seed: int = 0

    def __post_init__(self) -> None:
        if self.positional not in POSITIONALS:
            raise ValueError(f"unknown positional encoding {self.positional!r}; "
                             f"choose one of {', '.join(POSITIONALS)}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {self.attention!r}; choose one of {', '.join(ATTENTIONS)}")
        require_positive("ModelConfig", **{name: getattr(self, name) for name in (
            "vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "num_realizations",
            "num_sines", "kernel_size", "num_features", "chunk_size")})
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> ModelConfig:
        """Builds a config, ignoring unknown keys (checkpoints from newer versions)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

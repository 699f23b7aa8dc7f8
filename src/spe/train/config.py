"""Training configuration, read from a TOML file and overridden by command-line flags."""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from spe.encodings.positions import require_positive
from spe.models.config import ModelConfig

__all__ = ["TrainConfig", "load_config_file"]


@dataclass
class TrainConfig:
    """How to train.

    Attributes:
        data: folder of MIDI files, music21:NAME (a composer of music21's corpus), or None for the
            Bach chorales of music21.
        cache_dir: converted MIDI and token caches (None: ``$SPE_CACHE_DIR`` or ~/.cache/spe).
        out: run folder (checkpoint, logs, plots).
        steps: optimizer steps.
        seq_len: training length L in tokens (random crops).
        batch_size: crops per step.
        lr: peak learning rate (AdamW).
        warmup_steps: linear warmup; then cosine decay to ``lr * min_lr_ratio``.
        min_lr_ratio: final learning rate as a fraction of ``lr``.
        weight_decay: AdamW decay (not applied to norms, biases, embeddings, SPE parameters).
        grad_clip: global gradient-norm clip.
        eval_every: steps between validation passes and checkpoints.
        val_fraction: share of pieces held out for validation (split by piece).
        split_seed: seed of the split (fixed, independent of ``seed``).
        max_transpose: transposition augmentation in ±semitones (0 disables).
        feature_redraw_every: steps between FAVOR+ redraws (0: never).
        seed: seed of initialisation, crops and SPE codes.
        device: ``cpu`` or ``cuda``.
        threads: CPU threads (0: PyTorch's default).
        model: overrides of :class:`~spe.ModelConfig` fields (vocab_size comes from the data).
    """

    data: str | None = None
    cache_dir: str | None = None
    out: str = "runs/default"
    steps: int = 1000
    seq_len: int = 256
    batch_size: int = 8
    lr: float = 1e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 250
    val_fraction: float = 0.05
    split_seed: int = 0
    max_transpose: int = 6
    feature_redraw_every: int = 1000
    seed: int = 0
    device: str = "cpu"
    threads: int = 0
    model: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        require_positive("training", **{name: getattr(self, name) for name in (
            "steps", "seq_len", "batch_size", "eval_every")})
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.device not in ("cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        known = {f.name for f in fields(ModelConfig)} - {"vocab_size"}
        unknown = set(self.model) - known
        if unknown:
            raise ValueError(f"unknown model option(s) {sorted(unknown)}; known: {sorted(known)}")
        model = ModelConfig(vocab_size=1, **self.model)  # reject bad names before any data is read
        if model.positional == "ape-learned" and self.seq_len > model.max_positions:
            raise ValueError(f"seq_len {self.seq_len} exceeds the {model.max_positions} ape-learned embeddings; "
                             "raise max_positions or lower seq_len")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown training option(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)


def load_config_file(path: str | Path) -> dict:
    """Reads a TOML config: top-level keys are training options, a ``[model]`` table the model's.

    Raises:
        ValueError: if the file is missing or not valid TOML.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"config file {path} is not valid TOML: {err}") from None

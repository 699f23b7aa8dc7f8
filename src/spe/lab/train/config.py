"""Training configuration, read from a TOML file and overridden by command-line flags.

The model defaults that depend on other options live here, so that ``spe train``,
``spe sweep``, ``spe demo`` and ``spe.lab.train.train(TrainConfig(...))`` build the same model
from the same options (:func:`resolve_model_options`).
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path

from spe.lab.data.music import MAX_PIECE_TOKENS
from spe.lab.data.split import NUM_TEST_PIECES
from spe.encodings.registry import POSITIONAL_SPECS, positional_spec
from spe.field_types import check_field_types
from spe.models.config import ModelConfig
from spe.lab.options import check_options
from spe.lab.train.precision import check_precision
from spe.lab.train.state_passing import chain_steps

__all__ = ["TrainConfig", "load_config_file", "packaged_config", "resolve_model_options"]

log = logging.getLogger(__name__)
_DEFAULT_POSITIONAL = next(f.default for f in fields(ModelConfig) if f.name == "positional")


def resolve_model_options(model: dict, seq_len: int) -> dict:
    """Model options with the defaults that depend on the encoding and the training length filled in.

    * An encoding that acts on attention scores (``shaw``, ``music-relative`` …)
      gets softmax attention unless ``attention`` is given (then a kernel that cannot form
      scores still fails with a clear error).
    * An encoding windowed by default (the registry's ``windowed_by_default``: ``sinespe``,
      ``convspe``) gets ``attention_window = seq_len`` unless ``attention_window`` is given
      (0: the whole past). A window of the training length changes nothing inside the
      trained range and keeps SPE's lags within the trained ones beyond it: on the Bach
      chorales it cut the growth of cross-entropy from [0,256) to [512,768) from +17 % to
      +8 % (docs/ablation.md).

    Args:
        model: :class:`~spe.ModelConfig` options (not modified).
        seq_len: training length L in tokens.

    Returns:
        A new dict; an unknown encoding is left for :class:`~spe.ModelConfig` to reject.
    """
    model = dict(model)
    positional = model.get("positional", _DEFAULT_POSITIONAL)
    spec = POSITIONAL_SPECS.get(positional) if isinstance(positional, str) else None
    if spec is None:
        return model
    if spec.acts_on == "scores" and "attention" not in model:
        log.info("positional %s acts on attention scores: using softmax attention", positional)
        model["attention"] = "softmax"
    if spec.windowed_by_default and "attention_window" not in model:
        model["attention_window"] = seq_len
        log.info("%s: sliding attention window of %d positions (the training length; attention_window 0 "
                 "or --attention-window 0 for the whole past)", positional, seq_len)
    return model


@dataclass
class TrainConfig:
    """How to train.

    The options the training engine takes (:class:`~spe.lab.train.task.EngineSettings`) have the
    same names and rules as :class:`~spe.lab.lra.config.LRAConfig`'s, and two of them other
    defaults, each the setting its experiments were run with:

    * ``min_lr_ratio`` 0.1 (LRA: 0): the music runs decay to a tenth of the peak learning rate,
      as nanoGPT's recipe does (min_lr ≈ lr / 10), and the results of docs/results.md and
      docs/ablation.md were trained so; LRA's cosine decays to 0.
    * ``feature_redraw_every`` 1,000 (LRA: 0, never, LRA's setting): FAVOR+ projections redrawn
      at performer-pytorch's interval (``feature_redraw_interval = 1000``); the 500 steps of the
      packaged main job (``demo.toml``) end before the first redraw.

    ``threads`` is an option here; ``spe lra`` takes it as an argument of the run
    (:func:`spe.lab.lra.run_lra`), not of the experiment.

    Attributes:
        data: folder of MIDI files, music21:NAME (a composer of music21's corpus), or None for the
            Bach chorales of music21.
        cache_dir: converted MIDI and token caches (None: ``$SPE_CACHE_DIR`` or ~/.cache/spe).
        out: run folder (checkpoint, logs, plots).
        steps: optimizer steps.
        seq_len: training length L in tokens (random crops).
        batch_size: crops per optimizer step, over all processes: under ``torchrun`` with N
            processes each trains on ``batch_size / N`` of the same crops (N must divide it), so
            the same config trains the same model on 1 or N processes.
        lr: peak learning rate (AdamW).
        warmup_steps: linear warmup; then ``schedule``.
        schedule: ``cosine`` (decay to ``lr * min_lr_ratio`` at ``steps``) or ``rsqrt`` (LRA's
            lr·sqrt(warmup / step), no floor); see :func:`spe.lab.train.optim.learning_rate_factor`.
        min_lr_ratio: final learning rate of the cosine as a fraction of ``lr`` (0.1; see above).
        weight_decay: AdamW decay (not applied to norms, biases, embeddings, SPE parameters).
        grad_clip: global gradient-norm clip (0: none).
        positional_lr_scale: learning-rate multiplier of the positional-encoding parameters
            (:func:`spe.lab.train.optim.param_groups`); 1.0: the model's learning rate.
        eval_every: steps between validation passes and checkpoints.
        val_fraction: share of pieces held out for validation (split by piece).
        split_seed: seed of the split (fixed, independent of ``seed``).
        max_transpose: transposition augmentation in ±semitones (0 disables).
        max_piece_tokens: the longest piece kept, in REMI tokens; longer ones are cropped
            to their first ``max_piece_tokens`` and counted (:data:`spe.lab.data.music.MAX_PIECE_TOKENS`).
        test_min_tokens: hold out a test split of pieces at least this many tokens long, which
            neither training nor validation sees (``spe evaluate --split test``); 16 L + 1 for
            the 16× protocol (next-token targets at 16 L positions). 0: no test split.
        num_test_pieces: how many test pieces (chosen by
            :func:`spe.lab.data.split.hold_out_test_pieces`); ignored when ``test_min_tokens`` is 0.
        feature_redraw_every: steps between FAVOR+ redraws (0: never; 1,000, see above).
        seed: seed of initialisation, crops and SPE codes.
        device: ``cpu`` or ``cuda`` (under ``torchrun``: each process takes the GPU of its local rank).
        threads: CPU threads (0: PyTorch's default).
        precision: ``fp32``, ``bf16`` (autocast, CPU or CUDA) or ``fp16`` (autocast with a
            gradient scaler, CUDA only); weights and checkpoints stay float32.
        tensorboard: also write TensorBoard scalars to ``out/tensorboard`` (the ``log`` extra).
        keep_checkpoints: how many checkpoints ``out/checkpoints/step-SSSSSSS/`` to keep (the
            newest; ``out/model.safetensors`` is always the latest).
        compile: ``torch.compile`` the model for the training steps (off by default; where
            compilation is unavailable or fails, a warning and the uncompiled model).
        allow_data_change: let a resume continue on data whose pieces or split changed since
            the run started (with a warning naming the change); off: such a resume is refused.
        state_passing: start each training crop from the detached final state of a crop of the
            previous step (Buitrago Ruiz & Gu 2025; :mod:`spe.lab.train.state_passing`), positions
            running on from it, chains of up to 16 steps; recurrent-state kernels only (not
            softmax). Validation is unchanged. May be switched on when resuming (the paper
            post-trains with it).
        model: overrides of :class:`~spe.ModelConfig` fields (vocab_size comes from the data);
            completed by :func:`resolve_model_options` when the config is made.
    """

    data: str | None = None
    cache_dir: str | None = None
    out: str = "runs/default"
    steps: int = 1000
    seq_len: int = 256
    batch_size: int = 8
    lr: float = 1e-3
    warmup_steps: int = 100
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    positional_lr_scale: float = 1.0
    eval_every: int = 250
    val_fraction: float = 0.05
    split_seed: int = 0
    max_transpose: int = 6
    max_piece_tokens: int = MAX_PIECE_TOKENS
    test_min_tokens: int = 0
    num_test_pieces: int = NUM_TEST_PIECES
    feature_redraw_every: int = 1000
    seed: int = 0
    device: str = "cpu"
    threads: int = 0
    precision: str = "fp32"
    tensorboard: bool = False
    keep_checkpoints: int = 2
    compile: bool = False
    allow_data_change: bool = False
    state_passing: bool = False
    model: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_field_types(self.__dict__, type(self), "training option")
        if not isinstance(self.model, dict):
            raise TypeError(f"model must be a table of model options, got {self.model!r}")
        check_field_types(self.model, ModelConfig, "model option")
        check_options(self.__dict__)  # the rules spe lra's options follow too, before any data is read
        self.positional_lr_scale = float(self.positional_lr_scale)  # 10 and 10.0 are one setting
        if 0 < self.test_min_tokens <= self.seq_len + 1:
            raise ValueError(f"test_min_tokens {self.test_min_tokens} leaves no test position beyond seq_len "
                             f"{self.seq_len}: use 0 (no test split) or more than seq_len + 1 (16 × seq_len + 1 "
                             "for the 16× protocol)")
        if self.test_min_tokens > self.max_piece_tokens:
            raise ValueError(f"test_min_tokens {self.test_min_tokens} exceeds max_piece_tokens "
                             f"{self.max_piece_tokens}: pieces are cropped to that, so none would be long enough; "
                             "raise max_piece_tokens or lower test_min_tokens")
        check_precision(self.precision, "cuda" if str(self.device).startswith("cuda") else "cpu")
        if self.device not in ("cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        known = {f.name for f in fields(ModelConfig)} - {"vocab_size"}
        unknown = set(self.model) - known
        if unknown:
            raise ValueError(f"unknown model option(s) {sorted(unknown)}; known: {sorted(known)}")
        self.model = resolve_model_options(self.model, self.seq_len)
        model = ModelConfig(vocab_size=1, **self.model)  # reject bad names before any data is read
        limit = model.position_limit
        if limit is not None and self.seq_len > limit:
            what = positional_spec(model.positional).limit_text
            raise ValueError(f"seq_len {self.seq_len} exceeds the {limit} {what}; raise that option or lower seq_len")
        if self.state_passing:
            chain_steps(model, self.seq_len)

    def to_dict(self) -> dict:
        return asdict(self)

    def model_config(self, vocab_size: int) -> ModelConfig:
        """The model this configuration trains, for a tokenizer of ``vocab_size`` ids."""
        return ModelConfig(vocab_size=vocab_size, **self.model)

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


def packaged_config(name: str) -> Path:
    """The path of a TOML file shipped in ``spe/lab/configs`` (``demo``, ``ablation``)."""
    return Path(str(resources.files("spe.lab") / "configs" / f"{name}.toml"))

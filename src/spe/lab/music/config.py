"""Training configuration, read from a TOML file and overridden by command-line flags.

The model defaults that depend on other options are every task's
(:func:`spe.lab.model_defaults.resolve_model_options`), so that ``spe train``, ``spe sweep``,
``spe demo``, ``spe synth`` and ``spe.lab.music.train(TrainConfig(...))`` build the same model
from the same options.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path

from spe.lab.music.corpus import MAX_PIECE_TOKENS
from spe.lab.music.split import NUM_TEST_PIECES
from spe.encodings.registry import positional_spec
from spe.field_types import check_field_types
from spe.models.config import ModelConfig
from spe.lab.experiment import ExperimentOptions
from spe.lab.model_defaults import resolve_model_options
from spe.lab.options import read_toml, run_option
from spe.lab.music.state_passing import chain_steps

__all__ = ["RESUME_FREE", "TrainConfig", "load_config_file", "packaged_config", "packaged_defaults",
           "resolve_model_options", "resume_config"]

log = logging.getLogger(__name__)
def _refuse_unknown(values: dict, known: set, kind: str) -> None:
    """Raises ValueError naming the keys of ``values`` outside ``known`` (``unknown KIND option(s)``)."""
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown {kind} option(s) {sorted(unknown)}; known: {sorted(known)}")


@dataclass
class TrainConfig(ExperimentOptions):
    """How to train the music language model: the engine's options
    (:class:`~spe.lab.experiment.ExperimentOptions`, with their defaults) and the music task's.

    ``threads`` is an option here; ``spe lra`` takes it as an argument of the run
    (:func:`spe.lab.lra.run_lra`), not of the experiment.

    Attributes:
        (engine options): ``data`` (a folder of MIDI files, music21:NAME, a composer of
            music21's corpus, or None for the Bach chorales of music21), ``steps``,
            ``batch_size`` (crops per step), ``lr``, ``warmup_steps``, ``schedule``,
            ``min_lr_ratio`` (0.1: the results of docs/results.md and docs/ablation.md were
            trained so), ``weight_decay``, ``grad_clip``, ``positional_lr_scale``,
            ``eval_every``, ``feature_redraw_every`` (1,000: the 500 steps of the packaged main
            job end before the first redraw), ``device``, ``precision``, ``tensorboard``
            (``out/tensorboard``), ``keep_checkpoints`` (``out/checkpoints/step-SSSSSSS/``;
            ``out/model.safetensors`` is always the latest), ``compile``,
            ``allow_data_change``; ``model``: overrides of :class:`~spe.ModelConfig` fields
            (vocab_size comes from the data), completed by :func:`resolve_model_options`
            when the config is made.
        cache_dir: converted MIDI and token caches (None: ``$SPE_CACHE_DIR`` or ~/.cache/spe).
        out: run folder (checkpoint, logs, plots).
        seq_len: training length L in tokens (random crops).
        val_fraction: share of pieces held out for validation (split by piece).
        split_seed: seed of the split (fixed, independent of ``seed``).
        max_transpose: transposition augmentation in ±semitones (0 disables).
        max_piece_tokens: the longest piece kept, in REMI tokens; longer ones are cropped
            to their first ``max_piece_tokens`` and counted (:data:`spe.lab.music.corpus.MAX_PIECE_TOKENS`).
        tempos, time_signatures, merge_tracks: what the REMI tokenizer keeps besides the notes
            (:class:`spe.lab.music.corpus.TokenizerOptions`): tempo and time-signature tokens,
            both kept by default, and tracks that share a program, kept apart unless
            ``merge_tracks`` (a run from before these options keeps the tokenizer it stored).
        legacy_tokenizer: the tokenizer of the runs from before those three options, whole (the
            plans of the studies run then pin it, so that they rerun as they ran).
        test_min_tokens: hold out a test split of pieces at least this many tokens long, which
            neither training nor validation sees (``spe evaluate --split test``); 16 L + 1 for
            the 16× protocol (next-token targets at 16 L positions). 0: no test split.
        num_test_pieces: how many test pieces (chosen by
            :func:`spe.lab.music.split.hold_out_test_pieces`); ignored when ``test_min_tokens`` is 0.
        seed: seed of initialisation, crops and SPE codes.
        threads: CPU threads (0: PyTorch's default).
        state_passing: start each training crop from the detached final state of a crop of the
            previous step (Buitrago Ruiz & Gu 2025; :mod:`spe.lab.music.state_passing`), positions
            running on from it, chains of up to 16 steps; recurrent-state kernels only (not
            softmax). Validation is unchanged. May be switched on when resuming (the paper
            post-trains with it).
    """

    cache_dir: str | None = None
    out: str = run_option("out", default="runs/default")
    seq_len: int = 256
    val_fraction: float = 0.05
    split_seed: int = 0
    max_transpose: int = 6
    max_piece_tokens: int = MAX_PIECE_TOKENS
    tempos: bool = True
    time_signatures: bool = True
    merge_tracks: bool = False
    legacy_tokenizer: bool = False
    test_min_tokens: int = 0
    num_test_pieces: int = NUM_TEST_PIECES
    seed: int = run_option("seed")
    threads: int = run_option("threads")
    state_passing: bool = False

    def __post_init__(self) -> None:
        self.check_experiment_options("training option")  # the rules spe lra's options follow too
        try:
            check_field_types(self.model, ModelConfig, "model option")
        except TypeError as err:  # a value from a file or --model-option: the user's mistake, as LRA says
            raise ValueError(str(err)) from None
        if 0 < self.test_min_tokens <= self.seq_len + 1:
            raise ValueError(f"test_min_tokens {self.test_min_tokens} leaves no test position beyond seq_len "
                             f"{self.seq_len}: use 0 (no test split) or more than seq_len + 1 (16 × seq_len + 1 "
                             "for the 16× protocol)")
        if self.test_min_tokens > self.max_piece_tokens:
            raise ValueError(f"test_min_tokens {self.test_min_tokens} exceeds max_piece_tokens "
                             f"{self.max_piece_tokens}: pieces are cropped to that, so none would be long enough; "
                             "raise max_piece_tokens or lower test_min_tokens")
        _refuse_unknown(self.model, {f.name for f in fields(ModelConfig)} - {"vocab_size"}, "model")
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
        _refuse_unknown(values, {f.name for f in fields(cls)}, "training")
        return cls(**values)


def load_config_file(path: str | Path) -> dict:
    """Reads a TOML config: top-level keys are training options, a ``[model]`` table the model's.

    Raises:
        ValueError: if the file is missing or not a regular file, not UTF-8, not valid TOML
            or nested too deeply (:func:`spe.lab.options.read_toml`).
    """
    return read_toml(path, "config file")


def packaged_config(name: str) -> Path:
    """The path of a TOML file shipped in ``spe/lab/music/configs`` (``demo``, ``ablation``)."""
    return Path(str(resources.files("spe.lab") / "music" / "configs" / f"{name}.toml"))


def packaged_defaults() -> dict:
    """The training options of the packaged demo config, resolved (its values over
    :class:`TrainConfig`'s defaults): what a ``spe train`` flag left out means without --config."""
    return vars(TrainConfig.from_dict(load_config_file(packaged_config("demo"))))


# Options a resume may set anew: where and how the run goes on, not what it trains. ``steps`` may
# only grow past the step reached (the schedule then runs to the new end from there); ``lr`` may
# be lowered after a divergence (what the engine's message advises); state passing may be switched
# on for post-training (or off, with a warning).
RESUME_FREE = ("out", "steps", "lr", "device", "threads", "cache_dir", "tensorboard", "keep_checkpoints",
               "compile", "allow_data_change", "state_passing")


def _option_name(key: str, sources: dict) -> str:
    return sources.get(key, f"--{key.replace('_', '-')}")


def resume_config(out: str | Path, given: dict, *, sources: dict | None = None) -> TrainConfig | None:
    """The configuration that ``spe train --resume`` continues: the run's own, as its checkpoint
    records it (data folder and model included), with the options of :data:`RESUME_FREE` that are
    ``given`` on top.

    Every other option given must agree with the recorded one (``given`` holds only what the user
    set: flags, a config file's entries; ``model``: the model options set).

    Args:
        out: the run folder.
        given: training options set by the user, and ``model``: the model options set.
        sources: option -> how the user set it, for messages (default ``--option-name``; a model
            option is named so too).

    Returns:
        The configuration, or None where ``out`` holds no checkpoint, or one that records no
        training options (written by an older spe): the caller then builds it from ``given``.

    Raises:
        ValueError: in one line, naming the run folder, when a checkpoint of another command's
            task is there (:func:`~spe.lab.engine.run_folder.check_task`), an option given
            disagrees with the recorded one (both values named), or ``steps`` is below the step
            reached.
    """
    from spe.checkpoint import MODEL_FILE, load_metadata
    from spe.lab.music.split import same_data
    from spe.lab.options import MAX_THREADS
    from spe.lab.engine.run_folder import check_task

    sources = sources or {}
    out = Path(out)
    if not (out / MODEL_FILE).is_file():
        return None
    check_task(out, "", "train")
    metadata = load_metadata(out)
    recorded = metadata.get("train")
    if not isinstance(recorded, dict):
        return None
    where = f"--resume: {out} was trained with"
    given = dict(given)
    model_given = dict(given.pop("model", None) or {})
    _refuse_unknown(given, {f.name for f in fields(TrainConfig)}, "training")
    _refuse_unknown(model_given, {f.name for f in fields(ModelConfig)} - {"vocab_size"}, "model")
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.name != "model"}
    options = {**{k: v for k, v in recorded.items() if k != "model"}}
    for key, value in given.items():
        before = recorded.get(key, defaults.get(key))
        agree = same_data(before, value) if key == "data" else before == value
        if key not in RESUME_FREE and not agree:
            raise ValueError(f"{where} {key} {before!r}; {_option_name(key, sources)} gives {value!r}: leave it out "
                             "(the run's value is taken), or train into another --out")
        if key in RESUME_FREE:
            options[key] = value
    step = metadata.get("step") or 0
    if "steps" in given and given["steps"] < step:
        raise ValueError(f"--resume: {out} has trained {step} steps; {_option_name('steps', sources)} "
                         f"{given['steps']} would end before them: give more (steps may grow)")
    if "threads" not in given and (options.get("threads") or 0) > MAX_THREADS:
        log.info("--resume: %s was trained with %s threads; this machine has %d CPUs: PyTorch's default here",
                 out, options["threads"], MAX_THREADS)
        options["threads"] = 0
    model = dict(recorded.get("model") or {})
    if model_given:
        stored = ModelConfig.from_dict(metadata["config"]).to_dict()
        asked = ModelConfig(vocab_size=stored["vocab_size"], **{**model, **model_given}).to_dict()
        for key in model_given:
            if asked.get(key) != stored.get(key):
                raise ValueError(f"{where} {key} {stored.get(key)!r}; {_option_name(key, sources)} gives "
                                 f"{model_given[key]!r}: leave it out (the run's value is taken), or train into "
                                 "another --out")
    return TrainConfig.from_dict({**options, "out": str(out), "model": model})  # a moved run trains where it is

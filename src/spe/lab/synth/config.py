"""A synthetic-task experiment's configuration and the packaged preset (``src/spe/lab/synth/configs/cpu-small.toml``).

The preset file holds training options and a ``[model]`` table at the top level, and one
``[tasks.TASK]`` table per task (with its own ``model`` table) for what differs between tasks.
Later tables win: preset < task table < explicit options; ``model`` is merged key by key.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields
from importlib import resources

from spe.field_types import check_field_types
from spe.lab.experiment import ExperimentOptions
from spe.lab.options import check_option, rename_old_names, takes_old_names
from spe.lab.provenance import RUN_ONLY_KEYS  # re-exported: the options a folder may be continued with
from spe.lab.synth.data import TASKS, check_length, mqar_pairs, vocabulary
from spe.models.config import ModelConfig

__all__ = ["EVAL_LENGTHS", "MAX_EVAL_FACTOR", "MAX_TOKENS", "OLD_NAMES", "PRESETS", "RUN_ONLY_KEYS", "SynthConfig", "load_preset",
           "preset_config", "preset_defaults"]

PRESETS = ("cpu-small",)
MAX_EVAL_FACTOR = 64  # the longest test length, in training lengths
# The test lengths unless given: L, 4 L, 16 L and 64 L of the preset's L = 64 (written here only:
# the preset and the flag's help take them from here)
EVAL_LENGTHS = (64, 256, 1024, 4096)
# MQAR's key and value vocabularies, each: 8× the largest of Zoology's (8,192 tokens in all); the
# vocabulary is a dict and every logit row a float per token, so 10^8 keys would take gigabytes
MAX_TOKENS = 65536
# float32 logits of a training batch held at once: the logits, their log-softmax and its gradient
_TRAIN_LOGIT_COPIES = 3
# Old names of options -> their one name, read wherever options are (spe.lab.options.rename_old_names)
OLD_NAMES = {"train_length": "seq_len"}


@takes_old_names(OLD_NAMES)
@dataclass
class SynthConfig(ExperimentOptions):
    """One synthetic-task experiment (each seed is one run): the task, its data, a decoder LM
    (:class:`~spe.models.ModelConfig` options in ``model``) and the engine's options
    (:class:`~spe.lab.experiment.ExperimentOptions`; ``batch_size`` counts sequences of
    ``seq_len`` tokens). The run's seed and CPU threads are arguments of the run
    (:func:`spe.lab.synth.run_synth`), not options of the experiment.

    Attributes:
        task: ``flip-flop`` or ``mqar``.
        seq_len: L, the training length: tokens per training sequence (even, ≥ 4); the name of the
            training length in every task (``train_length``, its old name, is read as it in presets,
            plan rows and stored configs, :data:`OLD_NAMES`; ``cfg.train_length`` reads it too).
        eval_lengths: the test lengths in tokens (each even, ≥ 4, at most 64 L).
        eval_examples: sequences in the validation split (in-distribution at L, evaluated every
            ``eval_every`` steps) and, at most, per test split (one per distribution and length).
            0: the whole split, as for every task (:data:`spe.lab.options.OPTION_RULES`): the
            splits are generated, so "whole" is what ``eval_tokens`` allows, ``eval_tokens // L``
            validation sequences (at least one), the value the config then holds.
        eval_tokens: tokens per test split at most: a split of length T holds
            min(``eval_examples``, max(1, ``eval_tokens`` // T)) sequences (defaults: 128 up to
            T = 1,024, 32 at T = 4,096), so the quadratic cost of softmax at 64 L stays within a
            few times the training's while long splits still hold hundreds of targets.
        eval_batch_tokens: tokens per evaluation batch (a batch holds max(1, this // T)
            sequences of T tokens), so that long tests stay within memory.
        eval_seed: the seed of the fixed validation and test splits
            (:func:`spe.lab.synth.data.split_seed` of (task, split, length, eval_seed)),
            independent of the run's seed.
        p_ignore: flip-flop's training p(i) (the paper's 0.8); tests also use 0.98 (sparse) and 0.1 (dense).
        num_pairs: MQAR's N at the training length (0: L / 8); :func:`~spe.lab.synth.data.mqar_pairs`
            gives N at the test lengths.
        num_keys, num_values: MQAR's key and value vocabularies (disjoint).
        preset: the preset it came from (recorded only).

    Raises:
        ValueError: naming the option, the value and what is allowed (before any model is built).
    """

    task: str
    seq_len: int = 64
    eval_lengths: list = field(default_factory=lambda: list(EVAL_LENGTHS))
    eval_examples: int = 128
    eval_tokens: int = 131072
    eval_batch_tokens: int = 8192
    eval_seed: int = 0
    p_ignore: float = 0.8
    num_pairs: int = 0
    num_keys: int = 128
    num_values: int = 128
    preset: str = "cpu-small"

    def __post_init__(self) -> None:
        self.check_experiment_options("synthetic-task option")
        if self.task not in TASKS:
            raise ValueError(f"unknown synthetic task {self.task!r}; choose from {', '.join(TASKS)}")
        check_length(self.task, self.seq_len, "seq_len")
        self._check_eval()
        for name in ("eval_tokens", "eval_batch_tokens", "num_keys", "num_values"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        check_option("eval_examples", self.eval_examples)
        if self.eval_examples == 0:  # the whole split: here as many sequences as eval_tokens allows
            self.eval_examples = max(1, self.eval_tokens // self.seq_len)
        for name in ("num_keys", "num_values"):
            if getattr(self, name) > MAX_TOKENS:
                raise ValueError(f"{name} {getattr(self, name):,} exceeds the limit of {MAX_TOKENS:,} tokens "
                                 "(each becomes a vocabulary entry and a logit of every position)")
        if isinstance(self.eval_seed, bool) or not isinstance(self.eval_seed, int) or self.eval_seed < 0:
            raise ValueError(f"eval_seed must be an integer ≥ 0, got {self.eval_seed!r}")
        if not isinstance(self.p_ignore, int | float) or not 0.0 <= self.p_ignore < 1.0:
            raise ValueError(f"p_ignore must be a number in [0, 1), got {self.p_ignore!r}")
        if self.task == "mqar":
            if not self.num_pairs and self.seq_len < 8:
                raise ValueError(f"seq_len {self.seq_len} is too short for MQAR's default of "
                                 "seq_len / 8 key-value pairs: give seq_len ≥ 8, or num_pairs 1")
            pairs = self.train_pairs
            if not 1 <= pairs <= min(self.num_keys, self.seq_len // 4):
                raise ValueError(f"num_pairs {pairs} does not fit: MQAR takes 1 to min(num_keys {self.num_keys}, "
                                 f"seq_len / 4 = {self.seq_len // 4}) pairs")
        self._check_memory()
        self._check_model()

    def _check_memory(self) -> None:
        """Refuses logits and fixed splits (int64 tokens and targets) that cannot fit in the device's
        memory (:func:`~spe.lab.engine.memory.device_memory`), before anything is drawn."""
        from spe.lab.engine.memory import device_memory, format_bytes

        vocab = len(vocabulary(self.task, num_keys=0, num_values=0)) if self.task == "flip-flop" \
            else 1 + self.num_keys + self.num_values
        longest = max(self.seq_len, *self.eval_lengths)
        split = max(self.eval_examples * self.seq_len, *(self.examples_at(t) * t for t in self.eval_lengths))
        needs = {  # name -> (bytes, the options that set it)
            "a training batch's logits": (_TRAIN_LOGIT_COPIES * 4 * self.batch_size * self.seq_len * vocab,
                                          f"batch_size {self.batch_size} × seq_len {self.seq_len} × "
                                          f"{vocab:,} tokens"),
            "an evaluation batch's logits": (4 * max(self.eval_batch_tokens, longest) * vocab,
                                             f"max(eval_batch_tokens {self.eval_batch_tokens}, length {longest}) × "
                                             f"{vocab:,} tokens"),
            "the largest fixed split": (2 * 8 * split, f"{split:,} tokens of eval_examples {self.eval_examples}, "
                                        f"eval_tokens {self.eval_tokens} and the lengths"),
        }
        try:
            have = device_memory(self.device)
        except (RuntimeError, AssertionError, ValueError):  # no such device here: the engine says so
            return
        for what, (need, sizes) in needs.items():
            if need > have:
                raise ValueError(f"{what} needs {format_bytes(need)} ({sizes}) but {str(self.device).split(':')[0]} "
                                 f"memory is {format_bytes(have)}: lower these options")

    def _check_eval(self) -> None:
        lengths = self.eval_lengths
        if not isinstance(lengths, list | tuple) or not lengths:
            raise ValueError(f"eval_lengths must be a non-empty list of lengths, got {lengths!r}")
        self.eval_lengths = list(lengths)
        longest = MAX_EVAL_FACTOR * self.seq_len
        for length in lengths:
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise ValueError(f"eval lengths must be positive integers, got {length!r}")
            check_length(self.task, length, "every eval length")
            if length > longest:
                raise ValueError(f"eval length {length} exceeds {MAX_EVAL_FACTOR} × seq_len = {longest}")
        if len(set(lengths)) != len(lengths):
            raise ValueError(f"eval_lengths must be distinct, got {lengths!r}")

    def _check_model(self) -> None:
        from spe.encodings.registry import positional_spec
        from spe.lab.model_defaults import resolve_model_options

        try:
            check_field_types(self.model, ModelConfig, "model option")
        except TypeError as err:
            raise ValueError(str(err)) from None
        known = {f.name for f in fields(ModelConfig)} - {"vocab_size"}
        unknown = set(self.model) - known
        if unknown:
            raise ValueError(f"unknown model option(s) {sorted(unknown)}; known: {sorted(known)}")
        self.model = resolve_model_options(self.model, self.seq_len)
        config = self.model_config()
        from spe.encodings.onset import reads_onsets

        if reads_onsets(config):
            raise ValueError("spe_time 'onset' reads the onsets of music (REMI) tokens: spe synth's tasks have none")
        limit, longest = config.position_limit, max(self.seq_len, *self.eval_lengths)
        if limit is not None and longest > limit:
            raise ValueError(f"length {longest} exceeds the {limit} {positional_spec(config.positional).limit_text}; "
                             "raise that option or test shorter lengths")

    def examples_at(self, length: int) -> int:
        """Sequences in a test split of ``length`` tokens (see ``eval_tokens``)."""
        return min(self.eval_examples, max(1, self.eval_tokens // length))

    @property
    def train_length(self) -> int:
        """The training length :attr:`seq_len` under its old name (what callers and stored results
        read)."""
        return self.seq_len

    @property
    def train_pairs(self) -> int:
        """MQAR's N at the training length."""
        return self.num_pairs or self.seq_len // 8

    def pairs_at(self, length: int) -> int:
        """MQAR's N of the ``more-pairs`` test at ``length`` (:func:`~spe.lab.synth.data.mqar_pairs`)."""
        return mqar_pairs(length, self.seq_len, self.train_pairs, self.num_keys)

    def vocab(self) -> dict[str, int]:
        """Token name -> id."""
        return vocabulary(self.task, num_keys=self.num_keys, num_values=self.num_values)

    def model_config(self) -> ModelConfig:
        """The decoder LM of this experiment."""
        return ModelConfig(vocab_size=len(self.vocab()), **self.model)

    def to_dict(self) -> dict:
        return asdict(self)


def load_preset(preset: str) -> dict:
    """The parsed TOML of a packaged preset.

    Raises:
        ValueError: if ``preset`` is not one of ``PRESETS``.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown synthetic-task preset {preset!r}; choose from {', '.join(PRESETS)}")
    return tomllib.loads((resources.files("spe.lab") / "synth" / "configs" / f"{preset}.toml").read_text())


def preset_config(task: str, *, preset: str = "cpu-small", **overrides) -> SynthConfig:
    """The :class:`SynthConfig` of a preset for ``task``; ``overrides`` (None values ignored, so
    flags that were not given change nothing) win, ``model`` merged key by key.

    Raises:
        ValueError: on an unknown task, preset or option, or a value :class:`SynthConfig` refuses.
    """
    if task not in TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; choose from {', '.join(TASKS)}")
    table = rename_old_names(load_preset(preset), OLD_NAMES, f"preset {preset}")
    per_task = rename_old_names(table.pop("tasks", {}).get(task, {}), OLD_NAMES, f"preset {preset} task {task}")
    overrides = rename_old_names({k: v for k, v in overrides.items() if v is not None}, OLD_NAMES, "synthetic-task options")
    model = {**table.pop("model", {}), **per_task.pop("model", {}), **overrides.pop("model", {})}
    values = {**table, **per_task, **overrides, "model": model}
    known = {f.name for f in fields(SynthConfig)}
    unknown = sorted(set(values) - known - {"task", "preset"})
    if unknown:
        raise ValueError(f"unknown synthetic-task option(s) {unknown}; known: {', '.join(sorted(known))}")
    values.pop("task", None)
    values.pop("preset", None)
    return SynthConfig(task=task, preset=preset, **values)


def preset_defaults(preset: str = "cpu-small") -> dict[str, str]:
    """Per option a flag of ``spe synth`` sets, its value in ``preset`` (``64``; per task where the
    tasks differ: ``flip-flop 2000, mqar 3000``; lists comma-separated): what a flag left out
    means, for its help (:func:`spe.lab.cli.names.say_defaults`)."""
    from spe.lab.experiment import quiet_defaults

    with quiet_defaults():  # only read for the help: no model default announced
        configs = {task: preset_config(task, preset=preset) for task in TASKS}

    def words(value) -> str:
        return ",".join(map(str, value)) if isinstance(value, list) else str(value)

    options = ("seq_len", "eval_lengths", "steps", "batch_size", "lr", "eval_every", "device", "precision")
    values = {option: {task: words(getattr(cfg, option)) for task, cfg in configs.items()} for option in options}
    return {option: next(iter(by_task.values())) if len(set(by_task.values())) == 1
            else ", ".join(f"{task} {value}" for task, value in by_task.items()) for option, by_task in values.items()}

"""Long Range Arena run configuration and the packaged presets (``src/spe/lab/configs/lra/*.toml``).

A preset file holds ``[defaults]`` (training options) with ``[defaults.model]``
(:class:`~spe.models.ClassifierConfig` options), one table per task with its own ``model`` and
``data`` tables, and ``[positional.NAME.model]`` overrides applied to every task (e.g. sineSPE
per layer, convSPE shared; the SPE oracles ``sinespe-exact``, ``convspe-exact`` take their SPE's).
Later tables win: defaults < task < positional < explicit options.
"""

from __future__ import annotations

import tomllib
from dataclasses import MISSING, asdict, dataclass, field, fields
from importlib import resources

from spe.lab.data.listops import PIPELINES as LISTOPS_PIPELINES
from spe.lab.data.lra.tasks import TASKS
from spe.encodings.registry import EXACT_TWINS
from spe.field_types import check_field_types, describe_types, field_value_types
from spe.lab.options import check_options

__all__ = ["LISTOPS_PIPELINES", "PRESETS", "RUN_ONLY_KEYS", "LRAConfig", "load_preset",
           "model_option_names", "model_options", "parse_model_option", "preset_config"]

PRESETS = ("paper", "cpu-small")
# Options that change how a run is carried out, not what it computes: an experiment folder may be
# continued with other values of them.
RUN_ONLY_KEYS = ("device", "tensorboard", "keep_checkpoints", "compile", "allow_data_change")
_DATA_KEYS = ("num_train", "num_val", "num_test", "max_depth", "max_args", "min_length", "max_length",
              "drop_parentheses")
# ClassifierConfig fields an LRA experiment sets itself: from the data, or from its own fields.
_MODEL_KEYS_FROM_RUN = {"vocab_size": "the data", "num_classes": "the data", "grid": "the data",
                        "max_positions": "the data", "positional": "--positional", "attention": "--attention"}


@dataclass
class LRAConfig:
    """One LRA experiment: a task, a model and how to train it (each seed is one run).

    The options the training engine takes (:class:`~spe.lab.train.task.EngineSettings`) have the
    same names and rules as :class:`~spe.lab.train.config.TrainConfig`'s, and two of them other
    defaults, each the setting LRA's experiments were run with:

    * ``min_lr_ratio`` 0 (music: 0.1): the ``cpu-small`` cosine decays to 0 (its numbers in
      docs/lra.md were measured so); the ``paper`` preset's rsqrt schedule has no floor.
    * ``feature_redraw_every`` 0, never (music: 1,000): LRA's setting (docs/lra.md), which every
      result there was trained with but the ListOps study's ``ape-redraw`` row (1).

    CPU threads are an argument of the run (``spe lra --threads``, :func:`spe.lab.lra.run_lra`),
    not an option of the experiment.

    Attributes:
        task: ``listops``, ``text``, ``retrieval`` or ``image``.
        positional, attention: the encoder's positional encoding and kernel (registry names).
        preset: the preset it came from (recorded only).
        data: the task's folder in its official layout, or None for the embedded data.
        steps: optimizer steps per seed.
        batch_size: examples (pairs for Retrieval) per step.
        lr: peak learning rate of AdamW.
        schedule: ``cosine`` (linear warmup, cosine decay to ``lr · min_lr_ratio``) or ``rsqrt``
            (LRA's linear warmup then lr·sqrt(warmup / step), no floor).
        warmup_steps: linear warmup length.
        min_lr_ratio: final learning rate of the cosine as a fraction of ``lr`` (0; see above).
        weight_decay: AdamW decay of weight matrices (not of embeddings, norms, biases and
            positional parameters).
        grad_clip: gradient-norm clip (0: none).
        eval_every: steps between validations (and resumable checkpoints).
        eval_examples: validation examples used during training (0: the whole split); the
            best checkpoint is the one of highest validation accuracy on them.
        eval_batch_size: examples per evaluation batch.
        max_length: L, tokens per sequence (per document for Retrieval); None: the task's default.
        data_options: embedded-ListOps sizes and generator options (``num_train``, ``num_val``,
            ``num_test``, ``max_depth``, ``max_args``, ``min_length``, ``max_length``) and
            ``drop_parentheses``.
        model: :class:`~spe.models.ClassifierConfig` options (vocabulary, classes, grid and
            maximum positions come from the data).
        device: torch device of the runs (under ``torchrun``: each process takes the GPU of its
            local rank).
        num_realizations: overrides the preset's R (SPE).
        precision: ``fp32``, ``bf16`` (autocast, CPU or CUDA) or ``fp16`` (autocast with a
            gradient scaler, CUDA only); weights and checkpoints stay float32.
        tensorboard: also write TensorBoard scalars to each seed's ``tensorboard/``.
        keep_checkpoints: checkpoint folders ``checkpoints/step-SSSSSSS/`` kept per seed (the newest).
        compile: ``torch.compile`` the model for the training steps (falls back to the
            uncompiled model with a warning where compilation is unavailable or fails).
        listops_pipeline: how ListOps text becomes tokens: ``lossless`` (every symbol, the
            default) or ``lra-2021`` (what LRA's original input pipeline fed the models of the
            SPE paper: operators without ``[``, digits, no ``]`` and no parentheses; see
            :class:`spe.lab.data.listops.ListOpsTokenizer`). Part of the experiment: a folder run
            with one pipeline refuses the other. ListOps only.
        positional_lr_scale: learning-rate multiplier of the positional-encoding parameters
            (SPE frequencies, gains, filters and gates, learned embeddings; see
            :func:`spe.lab.train.optim.param_groups`); 1.0: the model's learning rate.
        feature_redraw_every: steps between redraws of the FAVOR+ projections (0: never, LRA's
            setting). The ListOps study's control: redrawn at every step, APE + Performer meets in
            distribution what a fresh SPE code per step does to the features (docs/lra.md).
        allow_data_change: let an interrupted seed resume on splits that changed since it
            started (with a warning naming the change); off: refused.
    """

    task: str
    positional: str
    attention: str
    preset: str = "cpu-small"
    data: str | None = None
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    schedule: str = "cosine"
    warmup_steps: int = 100
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_examples: int = 0
    eval_batch_size: int = 64
    max_length: int | None = None
    data_options: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    device: str = "cpu"
    num_realizations: int | None = None
    precision: str = "fp32"
    tensorboard: bool = False
    keep_checkpoints: int = 2
    compile: bool = False
    listops_pipeline: str = "lossless"
    positional_lr_scale: float = 1.0
    feature_redraw_every: int = 0
    allow_data_change: bool = False

    def __post_init__(self) -> None:
        try:
            check_field_types(self.__dict__, type(self), "LRA option")
        except TypeError as err:
            raise ValueError(str(err)) from None
        if self.task not in TASKS:
            raise ValueError(f"unknown LRA task {self.task!r}; choose from {', '.join(TASKS)}")
        from spe.lab.train.precision import check_precision

        check_precision(self.precision, "cuda" if str(self.device).startswith("cuda") else "cpu")
        check_options(self.__dict__)  # the rules spe train's options follow too
        if self.listops_pipeline not in LISTOPS_PIPELINES:
            raise ValueError(f"listops_pipeline must be one of {', '.join(LISTOPS_PIPELINES)}, "
                             f"got {self.listops_pipeline!r}")
        if self.task != "listops" and self.listops_pipeline != "lossless":
            raise ValueError(f"listops_pipeline applies to ListOps only, got {self.listops_pipeline!r} "
                             f"for task {self.task!r}")
        self.positional_lr_scale = float(self.positional_lr_scale)  # 10 and 10.0 name one folder
        unknown = set(self.data_options) - set(_DATA_KEYS)
        if unknown:
            raise ValueError(f"unknown data options {sorted(unknown)}; allowed: {', '.join(_DATA_KEYS)}")
        self._check_model()

    def _check_model(self) -> None:
        """Refuses an impossible model before any data is loaded (sizes come from the data later):
        each option alone (so that the message names it), then all of them together."""
        from spe.models.classifier_config import ClassifierConfig

        base = {"vocab_size": 512, "num_classes": 2, "positional": self.positional, "attention": self.attention,
                "grid": (1, 1)}
        for key, value in self.model.items():
            _check_model_option(key, value, base)
        options = dict(self.model)
        try:
            ClassifierConfig(**base, **options)
        except TypeError as err:  # a value of the wrong type deep in a check
            raise ValueError(f"model options {options}: {err}") from None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> LRAConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def model_option_names() -> tuple[str, ...]:
    """The :class:`~spe.models.ClassifierConfig` options an LRA experiment takes in ``model`` (sorted)."""
    from spe.models.classifier_config import ClassifierConfig

    return tuple(sorted(f.name for f in fields(ClassifierConfig) if f.name not in _MODEL_KEYS_FROM_RUN))


def _model_defaults() -> dict:
    from spe.models.classifier_config import ClassifierConfig

    return {f.name: f.default for f in fields(ClassifierConfig) if f.default is not MISSING}


def _check_model_option(key: str, value, base: dict) -> None:
    """One model option on its own: a known name, a value of its default's type, accepted by the config.

    Raises:
        ValueError: naming the option, the value and what is allowed.
    """
    from spe.models.classifier_config import ClassifierConfig

    allowed = model_option_names()
    if key not in allowed:
        where = f"it is set by {_MODEL_KEYS_FROM_RUN[key]}" if key in _MODEL_KEYS_FROM_RUN else \
            f"allowed: {', '.join(allowed)}"
        raise ValueError(f"unknown model option {key}={value!r}; {where}")
    kinds = field_value_types(ClassifierConfig)[key]
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise ValueError(f"model option {key} must be {describe_types(kinds)} (default "
                         f"{_model_defaults().get(key)!r}), got {value!r}")
    try:
        ClassifierConfig(**base, **{key: value})
    except (TypeError, ValueError) as err:
        raise ValueError(f"model option {key}={value!r}: {err}") from None


def parse_model_option(text: str) -> tuple[str, bool | int | float | str]:
    """``KEY=VALUE`` (``spe lra --model-option``) as ``(key, value)``: VALUE read as a TOML scalar
    (``true``, ``false``, ``64``, ``-2.5``, ``1e-3``, ``"text"``), else as the text itself
    (``spread``, ``orthogonal``).

    Only the syntax is checked here; :class:`LRAConfig` checks the option (name, type, value).

    Raises:
        ValueError: naming ``text`` when it has no ``=``, no key, or a value that is not a scalar.
    """
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key:
        raise ValueError(f"--model-option takes KEY=VALUE (e.g. gated=false, num_realizations=64), got {text!r}")
    try:
        value = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw
    if not isinstance(value, bool | int | float | str):
        raise ValueError(f"--model-option {key}: VALUE must be a number, true, false or a string, got {raw!r}")
    return key, value


def model_options(texts: list[str], *, decay: str | None = None) -> dict:
    """``spe lra --decay`` and every ``--model-option KEY=VALUE`` as one dict of model options.

    Raises:
        ValueError: as :func:`parse_model_option`, or naming two values given for one key.
    """
    options = {"decay": decay} if decay else {}
    for text in texts:
        key, value = parse_model_option(text)
        if key in options and options[key] != value:
            given = f"--decay {decay}" if key == "decay" and decay else f"--model-option {key}={options[key]!r}"
            raise ValueError(f"--model-option {key}={value!r} contradicts {given}; give one value")
        options[key] = value
    return options




def load_preset(preset: str) -> dict:
    """The parsed TOML of a packaged preset.

    Raises:
        ValueError: if ``preset`` is not one of ``PRESETS``.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown LRA preset {preset!r}; choose from {', '.join(PRESETS)}")
    text = (resources.files("spe.lab") / "configs" / "lra" / f"{preset}.toml").read_text()
    return tomllib.loads(text)


def _positional_model(table: dict, positional: str) -> dict:
    """The preset's ``[positional.NAME.model]`` options; an SPE oracle (``sinespe-exact``) takes its
    SPE's (``sinespe``) first, so the two models share their parameters and checkpoints."""
    tables = table.get("positional", {})
    twin = tables.get(EXACT_TWINS[positional], {}).get("model", {}) if positional in EXACT_TWINS else {}
    return {**twin, **tables.get(positional, {}).get("model", {})}


def preset_config(task: str, positional: str, attention: str, *, preset: str = "cpu-small",
                  **overrides) -> LRAConfig:
    """The :class:`LRAConfig` of a preset for one task, encoding and kernel.

    Args:
        task, positional, attention: as :class:`LRAConfig`.
        preset: ``paper`` or ``cpu-small``.
        overrides: :class:`LRAConfig` fields that win over the preset (None values are
            ignored, so command-line options that were not given change nothing); ``model``
            and ``data_options`` are merged key by key.

    Raises:
        ValueError: on an unknown task or preset, or an unknown override.
    """
    if task not in TASKS:
        raise ValueError(f"unknown LRA task {task!r}; choose from {', '.join(TASKS)}")
    table = load_preset(preset)
    defaults, task_table = dict(table.get("defaults", {})), dict(table.get(task, {}))
    model = {**defaults.pop("model", {}), **task_table.pop("model", {}), **_positional_model(table, positional)}
    data_options = task_table.pop("data", {})
    values = {**defaults, **task_table}
    known = {f.name for f in fields(LRAConfig)}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(f"unknown LRA options {sorted(unknown)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    model.update(given.pop("model", {}))
    data_options = {**data_options, **given.pop("data_options", {})}
    return LRAConfig(task=task, positional=positional, attention=attention, preset=preset,
                     **{**values, **given, "model": model, "data_options": data_options})

"""Long Range Arena run configuration and the packaged presets (``src/spe/lab/lra/configs/*.toml``).

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

from spe.lab.lra.data.listops import PIPELINES as LISTOPS_PIPELINES
from spe.lab.lra.data.tasks import TASKS
from spe.encodings.registry import EXACT_TWINS
from spe.field_types import describe_types, field_value_types
from spe.lab.experiment import ExperimentOptions, model_options
from spe.lab.options import rename_old_names, takes_old_names
from spe.lab.provenance import RUN_ONLY_KEYS  # re-exported: the options a folder may be continued with

__all__ = ["LISTOPS_PIPELINES", "OLD_NAMES", "PRESETS", "RUN_ONLY_KEYS", "LRAConfig", "load_preset", "preset_defaults",
           "model_option_names", "model_options", "preset_config"]

PRESETS = ("paper", "cpu-small")
# Old names of options -> their one name, read wherever options are (spe.lab.options.rename_old_names);
# a data_options' max_length is another option (embedded ListOps' longest row) and keeps its name
OLD_NAMES = {"max_length": "seq_len"}
_DATA_KEYS = ("num_train", "num_val", "num_test", "max_depth", "max_args", "min_length", "max_length",
              "drop_parentheses")
# ClassifierConfig fields an LRA experiment sets itself: from the data, or from its own fields.
_MODEL_KEYS_FROM_RUN = {"vocab_size": "the data", "num_classes": "the data", "grid": "the data",
                        "max_positions": "the data", "positional": "--positional", "attention": "--attention"}


@takes_old_names(OLD_NAMES)
@dataclass
class LRAConfig(ExperimentOptions):
    """One LRA experiment: a task, a model and how to train it (each seed is one run).

    The engine's options are :class:`~spe.lab.experiment.ExperimentOptions`'; this class is
    LRA's preset of three of them, each the setting LRA's experiments were run with:

    * ``batch_size`` 32 (music: 8 crops of L tokens): examples (pairs for Retrieval) per step.
    * ``min_lr_ratio`` 0 (music: 0.1): the ``cpu-small`` cosine decays to 0 (its numbers in
      docs/lra.md were measured so); the ``paper`` preset's rsqrt schedule has no floor.
    * ``feature_redraw_every`` 0, never (music: 1,000): LRA's setting (docs/lra.md), which every
      result there was trained with but the ListOps study's ``ape-redraw`` row (1: redrawn at
      every step, APE + Performer meets in distribution what a fresh SPE code per step does to
      the features).

    CPU threads are an argument of the run (``spe lra --threads``, :func:`spe.lab.lra.run_lra`),
    not an option of the experiment.

    Attributes:
        task: ``listops``, ``text``, ``retrieval`` or ``image``.
        positional, attention: the encoder's positional encoding and kernel (registry names).
        (engine options): as :class:`~spe.lab.experiment.ExperimentOptions` (``data``: the
            task's folder in its official layout, or None for the embedded data; ``model``:
            :class:`~spe.models.ClassifierConfig` options, whose vocabulary, classes, grid and
            maximum positions come from the data), with the three defaults above.
        preset: the preset it came from (recorded only).
        eval_examples: validation examples used during training (0: the whole split); the
            best checkpoint is the one of highest validation accuracy on them.
        eval_batch_size: examples per evaluation batch.
        seq_len: L, the training length: tokens per sequence (per document for Retrieval), longer
            ones truncated; None: the task's default. The name of the training length in every task
            (``max_length``, its old name, is read as it in presets, plan rows and stored configs,
            :data:`OLD_NAMES`; ``cfg.max_length`` reads it too).
        data_options: embedded-ListOps sizes and generator options (``num_train``, ``num_val``,
            ``num_test``, ``max_depth``, ``max_args``, ``min_length``, ``max_length``) and
            ``drop_parentheses``.
        num_realizations: overrides the preset's R (SPE).
        listops_pipeline: how ListOps text becomes tokens: ``lossless`` (every symbol, the
            default) or ``lra-2021`` (what LRA's original input pipeline fed the models of the
            SPE paper: operators without ``[``, digits, no ``]`` and no parentheses; see
            :class:`spe.lab.lra.data.listops.ListOpsTokenizer`). Part of the experiment: a folder run
            with one pipeline refuses the other. ListOps only.
    """

    task: str
    positional: str
    attention: str
    batch_size: int = field(default=32, kw_only=True)
    min_lr_ratio: float = field(default=0.0, kw_only=True)
    feature_redraw_every: int = field(default=0, kw_only=True)
    preset: str = "cpu-small"
    eval_examples: int = 0
    eval_batch_size: int = 64
    seq_len: int | None = None
    data_options: dict = field(default_factory=dict)
    num_realizations: int | None = None
    listops_pipeline: str = "lossless"

    def __post_init__(self) -> None:
        self.check_experiment_options("LRA option")  # the rules spe train's options follow too
        if self.task not in TASKS:
            raise ValueError(f"unknown LRA task {self.task!r}; choose from {', '.join(TASKS)}")
        if self.listops_pipeline not in LISTOPS_PIPELINES:
            raise ValueError(f"listops_pipeline must be one of {', '.join(LISTOPS_PIPELINES)}, "
                             f"got {self.listops_pipeline!r}")
        if self.task != "listops" and self.listops_pipeline != "lossless":
            raise ValueError(f"listops_pipeline applies to ListOps only, got {self.listops_pipeline!r} "
                             f"for task {self.task!r}")
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
        try:  # the pair first: a preset's option (dropout) is not to blame for it
            ClassifierConfig(**base)
        except ValueError as err:
            raise ValueError(f"positional {self.positional!r} with attention {self.attention!r}: {err}") from None
        for key, value in self.model.items():
            _check_model_option(key, value, base)
        options = dict(self.model)
        try:
            ClassifierConfig(**base, **options)
        except TypeError as err:  # a value of the wrong type deep in a check
            raise ValueError(f"model options {options}: {err}") from None

    @property
    def max_length(self) -> int | None:
        """The training length :attr:`seq_len` under its old name."""
        return self.seq_len

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> LRAConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in rename_old_names(values, OLD_NAMES).items() if k in known})


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


def load_preset(preset: str) -> dict:
    """The parsed TOML of a packaged preset.

    Raises:
        ValueError: if ``preset`` is not one of ``PRESETS``.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown LRA preset {preset!r}; choose from {', '.join(PRESETS)}")
    text = (resources.files("spe.lab") / "lra" / "configs" / f"{preset}.toml").read_text()
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
    values = {**rename_old_names(defaults, OLD_NAMES, f"preset {preset}"),
              **rename_old_names(task_table, OLD_NAMES, f"preset {preset} task {task}")}
    overrides = rename_old_names(overrides, OLD_NAMES, "LRA options")
    known = {f.name for f in fields(LRAConfig)}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(f"unknown LRA options {sorted(unknown)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    model.update(given.pop("model", {}))
    data_options = {**data_options, **given.pop("data_options", {})}
    return LRAConfig(task=task, positional=positional, attention=attention, preset=preset,
                     **{**values, **given, "model": model, "data_options": data_options})


def preset_defaults(preset: str = "cpu-small") -> dict[str, str]:
    """Per run option (``steps``, ``batch_size``, ``eval_every``, ``seq_len``,
    ``num_realizations``), its value in ``preset`` for each task, in words
    (``listops 2000, text 600, retrieval 500, image 1000``): what ``spe lra`` flags left out mean."""
    from spe.lab.lra.data.listops import LISTOPS_MAX_TOKENS
    from spe.lab.lra.data.tasks import DEFAULT_LENGTHS

    configs = {task: preset_config(task, "sinespe", "performer", preset=preset) for task in TASKS}

    def value(cfg: LRAConfig, option: str):
        if option == "num_realizations":
            return cfg.model.get(option)
        if option == "seq_len" and cfg.seq_len is None:
            return DEFAULT_LENGTHS[cfg.task] or f"its longest row, at most {LISTOPS_MAX_TOKENS}"
        return getattr(cfg, option)

    return {option: ", ".join(f"{task} {value(cfg, option)}" for task, cfg in configs.items())
            for option in ("steps", "batch_size", "eval_every", "seq_len", "num_realizations")}

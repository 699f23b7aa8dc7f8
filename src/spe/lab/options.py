"""User options decoded and checked in one place, shared by the library and the ``spe`` command.

Config files and command-line flags have no null, so some options spell "none" as 0; each
such convention is decoded once ("window 0 means None" was once decoded in three
places). The options of training (``spe train``'s :class:`~spe.lab.music.config.TrainConfig`,
``spe lra``'s :class:`~spe.lab.lra.config.LRAConfig`, config files, sweep and study rows) have one
rule each, in :data:`OPTION_RULES`, so that an option means the same and is refused the same
way whichever front end sets it, before any data is read or any model built (a
``grad_clip`` of -1 once turned ``spe train`` into gradient ascent while ``spe lra`` refused it).
Each option of the training engine is declared once, as a field of :class:`ExperimentOptions`
(:func:`option`: default, rule, help): the engine's settings
(:class:`~spe.lab.engine.task.EngineSettings`), the engine's rules in :data:`OPTION_RULES` (which
the TOML configs are checked with) and the flags of ``spe train`` and ``spe lra``
(:func:`option_flag`) are derived from it. The options of a run, whichever task it trains (seed,
threads, device, precision, out), are declared once likewise, as the fields of :class:`RunOptions`:
every command's ``--seed``, ``--threads``, ``--device``, ``--precision`` and ``--out``, their help
and their checks derive from it (:func:`run_flag`, :func:`check_flags`), and so do the device and
precision of :class:`ExperimentOptions`.
No torch import: the CLI checks its flags before loading anything heavy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields

from spe.field_types import check_field_types

__all__ = ["MAX_THREADS", "OPTION_RULES", "SCHEDULES", "ExperimentOptions", "OptionRule", "RunOptions",
           "available_cpus", "check_flags", "check_option", "check_options", "check_seed", "check_threads", "option",
           "option_flag", "parse_int_list", "parse_seeds", "read_json_object", "read_toml", "rename_old_names",
           "run_flag", "run_option", "set_threads", "takes_old_names"]

# The learning-rate schedules of the engine (spe.lab.engine.optim.learning_rate_factor): named here,
# beside their rule, so that a schedule is checked as the other options are, without torch.
SCHEDULES = ("cosine", "rsqrt")


@dataclass(frozen=True)
class OptionRule:
    """What values an option takes: an integer or a finite number within bounds, or one of a few names.

    Attributes:
        integer: an int is required (else an int or a float); bools are refused either way.
            Ignored where ``choices`` are given.
        low, high: the bounds (±inf: none); ``low_open``, ``high_open``: a bound itself is excluded.
        note: what a special value means, shown in the message (``0: no clipping``).
        optional: None is allowed too (the option is unset).
        text: the allowed values in words, where the bounds alone would say it less well.
        choices: the names the option takes (a string option, e.g. a schedule); empty: a number.
        pattern: a regular expression the whole string must match (a device: ``cuda:0``); say
            what it allows in ``text``.
    """

    integer: bool
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    note: str = ""
    optional: bool = False
    text: str = ""
    choices: tuple[str, ...] = ()
    pattern: str = ""

    def allowed(self) -> str:
        """The allowed values in words (``an integer ≥ 0 (0: never)``, ``a number in [0, 1]``,
        ``one of cosine, rsqrt``)."""
        if self.text:
            return self.text
        if self.choices:
            return f"one of {', '.join(self.choices)}"
        if self.integer and self.low == 1 and self.high == math.inf:
            words = "a positive integer"
        elif self.high < math.inf:
            words = (f"{'an integer' if self.integer else 'a number'} in {'(' if self.low_open else '['}"
                     f"{self.low:g}, {self.high:g}{')' if self.high_open else ']'}")
        else:
            kind = "an integer" if self.integer else "a finite number"
            words = f"{kind} {'>' if self.low_open else '≥'} {self.low:g}"
        return words + (f" ({self.note})" if self.note else "")

    def accepts(self, value) -> bool:
        if value is None:
            return self.optional
        if self.choices:
            return isinstance(value, str) and value in self.choices
        if self.pattern:
            return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None
        if isinstance(value, bool) or not isinstance(value, int if self.integer else int | float):
            return False
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


# More threads than CPUs only slows a run down, and far more crash inside the thread pools
# (100,000 segfaulted once the data was read and the run folder locked; 20,000 aborted libgomp).
MAX_THREADS = available_cpus()

_POSITIVE = OptionRule(integer=True, low=1)
# torch.manual_seed and Generator.manual_seed take a signed 64-bit integer; beyond it they overflow
_SEED = OptionRule(integer=True, low=0, high=2 ** 63 - 1, text="an integer in [0, 2**63 - 1]")


def option(default, rule: OptionRule | None = None, help: str = "", *, engine: bool = True):
    """One option of :class:`ExperimentOptions`: its default, its rule (None: its type and its own
    check say it all), its one-line help (the flag's, before ``say_defaults`` appends the resolved
    default) and whether the engine takes it (:class:`~spe.lab.engine.task.EngineSettings` has
    exactly the fields marked ``engine``)."""
    return field(default=default, metadata={"rule": rule, "help": help, "engine": engine})


@dataclass(kw_only=True)
class RunOptions:
    """The options of one run, whichever task it trains or command it serves: their one
    declaration (each field's default, rule and help, :func:`option`). Every command's flag of
    these names is derived from it (:func:`run_flag`: the help, the type, a command's own default),
    checked by its rule before any work (:func:`check_flags`), and :class:`ExperimentOptions`
    takes its ``device`` and ``precision`` from here.

    Attributes:
        seed: seeds the initialisation, the data's draws, SPE's codes or the sampling; what
            ``torch.manual_seed`` takes.
        threads: CPU threads (0: PyTorch's default), at most the CPUs this process may use:
            more only slow a run down and far more crash inside the thread pools (100,000
            segfaulted once the data was read; 20,000 aborted libgomp).
        device: ``cpu`` or ``cuda`` (``cuda:N``; under ``torchrun`` each process takes the GPU
            of its local rank).
        precision: ``fp32``, ``bf16`` (autocast, CPU or CUDA) or ``fp16`` (autocast with a
            gradient scaler, CUDA only); weights and checkpoints stay float32. Its names are
            :data:`spe.lab.engine.precision.PRECISIONS` (torch), checked there.
        out: where the command writes (a folder, or the file ``spe generate`` writes); nothing
            is written elsewhere and no file the command did not write is replaced.
    """

    seed: int = option(0, _SEED, "random seed, an integer in [0, 2**63 - 1]", engine=False)
    threads: int = option(0, OptionRule(integer=True, low=0, high=MAX_THREADS, optional=True,
                                        text=f"0 (PyTorch's default) or a positive number of CPU threads up to "
                                        f"{MAX_THREADS} (the CPUs this process may use)"),
                          "CPU threads, at most the CPUs this process may use (0: PyTorch's default)", engine=False)
    device: str = option("cpu", OptionRule(integer=False, pattern=r"cpu|cuda(:\d+)?",
                                           text="'cpu', 'cuda' or 'cuda:N'"), "cpu, cuda or cuda:N")
    precision: str = option("fp32", help="fp32, bf16 autocast (CPU or CUDA) or fp16 autocast with a gradient scaler "
                            "(CUDA)")
    out: str | None = option(None, help="where the command writes", engine=False)


_RUN_FIELDS = {f.name: f for f in fields(RunOptions)}


def run_option(name: str, *, default=MISSING, engine: bool = False):
    """The field of a configuration that is the run option ``name`` (ExperimentOptions' device and
    precision, TrainConfig's seed, threads and out): its rule and help are :class:`RunOptions`', not
    copied; ``default``: the configuration's own where it differs (a run folder), else the record's;
    ``engine``: whether :class:`~spe.lab.engine.task.EngineSettings` takes it."""
    declared = _RUN_FIELDS[name]
    return field(default=declared.default if default is MISSING else default,
                 metadata={**declared.metadata, "engine": engine})


@dataclass(kw_only=True)
class ExperimentOptions:
    """The options of the one training engine, named, typed and checked alike for every task;
    keyword-only. Their one declaration: each field's metadata (:func:`option`) holds its rule
    and its flag's help, from which :class:`~spe.lab.engine.task.EngineSettings`,
    :data:`OPTION_RULES` and the flags (:func:`option_flag`) are derived.

    Attributes:
        data: the task's data (a folder, or a named corpus); None: the task's embedded default.
        steps: optimizer steps (per seed).
        batch_size: examples per optimizer step, over all processes (under ``torchrun`` with N
            processes each takes ``batch_size / N`` of the same examples, so the same config
            trains the same model on 1 or N processes).
        lr: peak learning rate (AdamW).
        warmup_steps: linear warmup length; then ``schedule``.
        schedule: ``cosine`` (decay to ``lr · min_lr_ratio`` at ``steps``) or ``rsqrt`` (LRA's
            lr·sqrt(warmup / step), no floor); :func:`spe.lab.engine.optim.learning_rate_factor`.
        min_lr_ratio: final learning rate of the cosine as a fraction of ``lr``: 0.1, as
            nanoGPT's recipe (min_lr ≈ lr / 10).
        weight_decay: AdamW decay of weight matrices (not of norms, biases, embeddings and
            positional parameters).
        grad_clip: global gradient-norm clip (0: none).
        positional_lr_scale: learning-rate multiplier of the positional-encoding parameters
            (SPE frequencies, gains, filters and gates, learned embeddings;
            :func:`spe.lab.engine.optim.param_groups`); 1.0: the model's learning rate.
        eval_every: steps between validations and (resumable) checkpoints.
        feature_redraw_every: steps between redraws of the FAVOR+ projections (0: never):
            1,000, performer-pytorch's ``feature_redraw_interval``.
        device: ``cpu`` or ``cuda`` (``cuda:N``; under ``torchrun`` each process takes the GPU
            of its local rank).
        precision: ``fp32``, ``bf16`` (autocast, CPU or CUDA) or ``fp16`` (autocast with a
            gradient scaler, CUDA only); weights and checkpoints stay float32.
        tensorboard: also write TensorBoard scalars to the run's ``tensorboard/`` (the ``log`` extra).
        keep_checkpoints: checkpoint folders ``checkpoints/step-SSSSSSS/`` kept (the newest).
        compile: ``torch.compile`` the model for the training steps (where compilation is
            unavailable or fails, a warning and the uncompiled model).
        allow_data_change: let a resume continue on data whose examples or split changed since
            the run started (with a warning naming the change); off: such a resume is refused.
        model: the task's model options (:class:`~spe.models.ModelConfig` for the language
            model, :class:`~spe.models.ClassifierConfig` for LRA), checked by the task's class.

    Raises:
        ValueError: from :meth:`check_experiment_options`, naming the option, the value and
            what is allowed, before any data is read.
    """

    data: str | None = option(None, engine=False)
    steps: int = option(1000, _POSITIVE, "optimizer steps")
    batch_size: int = option(8, _POSITIVE,
                             "examples per step over all processes (under torchrun each takes its share)")
    lr: float = option(1e-3, OptionRule(integer=False, low=0, low_open=True), "peak learning rate")
    warmup_steps: int = option(100, OptionRule(integer=True, low=0),
                               "linear warmup steps (a warning if not below --steps)")
    schedule: str = option("cosine", OptionRule(integer=False, choices=SCHEDULES), "learning-rate schedule")
    min_lr_ratio: float = option(0.1, OptionRule(integer=False, low=0, high=1),
                                 "final learning rate of the cosine as a fraction of --lr")
    weight_decay: float = option(0.01, OptionRule(integer=False, low=0), "AdamW weight decay")
    grad_clip: float = option(1.0, OptionRule(integer=False, low=0, note="0: no clipping"), "gradient-norm clip")
    positional_lr_scale: float = option(
        1.0, OptionRule(integer=False, low=0, low_open=True, note="1.0: the model's learning rate"),
        "lr multiplier of positional parameters")
    eval_every: int = option(250, _POSITIVE, "steps between validation and checkpoints")
    feature_redraw_every: int = option(1000, OptionRule(integer=True, low=0, note="0: never"),
                                       "steps between FAVOR+ feature redraws")
    device: str = run_option("device", engine=True)
    precision: str = run_option("precision", engine=True)
    tensorboard: bool = option(False, help="also write TensorBoard scalars to OUT/tensorboard (needs: pip install "
                               "'spe[log]')")
    keep_checkpoints: int = option(2, _POSITIVE, "checkpoints kept in OUT/checkpoints")
    compile: bool = option(False, help="torch.compile the model for training, and the elementwise passes of sineSPE's "
                           "learned-time product (off by default; falls back to the uncompiled model with a "
                           "warning where compilation is unavailable)")
    allow_data_change: bool = option(False, help="let --resume continue on data whose examples or split changed "
                                     "(a warning says what changed)", engine=False)
    model: dict = field(default_factory=dict, metadata={"engine": False})

    def check_experiment_options(self, what: str) -> None:
        """Checks every option's type (the resolved annotations) and rule
        (:data:`spe.lab.options.OPTION_RULES`), the device and the precision on it.

        Args:
            what: how messages name an option (``training option``, ``LRA option``).

        Raises:
            ValueError: naming the option and the value received (a wrong type too).
        """
        try:
            check_field_types(self.__dict__, type(self), what)
        except TypeError as err:
            raise ValueError(str(err)) from None
        check_options(self.__dict__)
        from spe.lab.engine.precision import check_precision  # torch: only once the options are read

        check_precision(self.precision, "cuda" if self.device.startswith("cuda") else "cpu")
        self.positional_lr_scale = float(self.positional_lr_scale)  # 10 and 10.0 are one setting


# Option name -> its rule, whichever configuration has the option (an option of the same name
# means the same in every configuration): the engine's, declared with ExperimentOptions' fields,
# the run's (RunOptions), then the tasks' own.
OPTION_RULES: dict[str, OptionRule] = {
    **{f.name: f.metadata["rule"] for f in fields(ExperimentOptions) if f.metadata.get("rule")},
    **{f.name: f.metadata["rule"] for f in fields(RunOptions) if f.metadata.get("rule")},
    "eval_batch_size": _POSITIVE,
    # the training length of every task; None only where the config's type allows it (LRA: the
    # task's default), so the words say what every task takes
    "seq_len": OptionRule(integer=True, low=1, optional=True, text="a positive integer"),
    "max_piece_tokens": _POSITIVE,
    "test_min_tokens": OptionRule(integer=True, low=0, note="tokens; 0: no test split"),
    "num_test_pieces": _POSITIVE,
    # the positions evaluated (spe evaluate, report, demo --eval-length)
    "max_length": OptionRule(integer=True, low=1, optional=True, text="a positive integer or unset"),
    "num_realizations": OptionRule(integer=True, low=1, optional=True, text="a positive integer or unset"),
    "val_fraction": OptionRule(integer=False, low=0, high=1, low_open=True, high_open=True),
    "eval_examples": OptionRule(integer=True, low=0, note="0: the whole split"),
    "max_transpose": OptionRule(integer=True, low=0, note="semitones; 0: no transposition"),
    "split_seed": _SEED,
}


_FLAG_TYPES = {"int": int, "float": float}
_METAVARS = {"threads": "N"}


def _flag(declared, note: str, default) -> tuple[str, dict]:
    """``--NAME`` and its argparse keywords, derived from the field ``declared``: a bool as a switch
    (``store_true``), an int or a float read as one, the declared help, then ``; NOTE`` and
    ``(default DEFAULT)`` where a command gives them."""
    help = declared.metadata["help"] + (f"; {note}" if note else "")
    keywords = {"help": help if default is None else f"{help} (default {default})"}
    if declared.type == "bool":
        keywords["action"] = "store_true"
    else:
        if declared.type in _FLAG_TYPES:
            keywords["type"] = _FLAG_TYPES[declared.type]
        if default is not None:
            keywords["default"] = default
        if declared.name in _METAVARS:
            keywords["metavar"] = _METAVARS[declared.name]
    return "--" + declared.name.replace("_", "-"), keywords


def option_flag(name: str, *, note: str = "", default=None) -> tuple[str, dict]:
    """The command-line flag of the option ``name`` of :class:`ExperimentOptions` and its argparse
    keywords, derived from the field: ``--NAME`` with dashes, a bool as a switch (``store_true``),
    an int or a float read as one, the help the option declares, followed by a command's ``note``
    (``per seed``) and its ``default`` (None: unset, the command's config resolves it).

    Raises:
        KeyError: if ``name`` is not an option of ExperimentOptions (a programming error).
    """
    return _flag({f.name: f for f in fields(ExperimentOptions)}[name], note, default)


def run_flag(name: str, *, note: str = "", default=None) -> tuple[str, dict]:
    """As :func:`option_flag`, for the option ``name`` of :class:`RunOptions` (``--threads``,
    ``--out``: ``note`` then says what this command writes there).

    Raises:
        KeyError: if ``name`` is not a run option (a programming error).
    """
    return _flag(_RUN_FIELDS[name], note, default)


def check_flags(values: Mapping, flags: Mapping[str, str] | None = None) -> None:
    """Checks every value of ``values`` (a command's parsed flags, by destination) that is set and
    has a rule (:data:`OPTION_RULES`), before any work: a flag's check is its option's rule.

    Args:
        values: destination -> value (None: not given).
        flags: destination -> the flag that messages name (default ``--dest-with-dashes``).

    Raises:
        ValueError: ``--FLAG must be ALLOWED, got VALUE``, for the first value refused.
    """
    flags = flags or {}
    for dest, value in values.items():
        if value is not None and dest in OPTION_RULES:
            check_option(dest, value, flags.get(dest, "--" + dest.replace("_", "-")))


def rename_old_names(values: Mapping, old_names: Mapping[str, str], where: str = "") -> dict:
    """``values`` (a config file's, a preset's, a plan row's, a stored config's options) with each
    old name of an option renamed to its one name (``old_names``: old -> new, e.g. synth's
    ``train_length`` -> ``seq_len``), so that what was written before keeps working.

    Args:
        values: option -> value (not modified).
        old_names: the configuration's old names.
        where: how a log line names the source (``plan P row R``); empty: say nothing (a stored
            config, which the user did not write).

    Raises:
        ValueError: naming both names when both are given.
    """
    values = dict(values)
    for old, new in old_names.items():
        if old not in values:
            continue
        if new in values:
            raise ValueError(f"{where + ': ' if where else ''}{old} is the old name of {new}: give {new} only, "
                             f"got both ({old} {values[old]!r}, {new} {values[new]!r})")
        values[new] = values.pop(old)
        if where:
            import logging

            logging.getLogger(__name__).info("%s: %s is the old name of %s (read as %s)", where, old, new, new)
    return values


def takes_old_names(old_names: Mapping[str, str]):
    """Class decorator, above ``@dataclass``: the configuration's constructor takes each old name of
    an option (``old_names``: old -> new) as a keyword too, read as the new one
    (:func:`rename_old_names`), so that ``SynthConfig(task=..., train_length=64)`` keeps working."""
    def wrap(cls):
        init = cls.__init__

        def __init__(self, *args, **options):
            init(self, *args, **rename_old_names(options, old_names, cls.__name__))

        __init__.__doc__, __init__.__wrapped__ = init.__doc__, init
        cls.__init__ = __init__
        return cls

    return wrap


def check_option(option: str, value, name: str | None = None) -> None:
    """Checks ``value`` against the rule of ``option`` (:data:`OPTION_RULES`).

    Args:
        option: the option's name in the table (``grad_clip``).
        value: its value.
        name: how the caller names it in messages (``--threads``; default ``option``).

    Raises:
        ValueError: ``NAME must be ALLOWED, got VALUE`` (bools, NaN and infinities refused).
        KeyError: if ``option`` has no rule (a programming error).
    """
    rule = OPTION_RULES[option]
    if not rule.accepts(value):
        raise ValueError(f"{name or option} must be {rule.allowed()}, got {value!r}")


def check_options(values: Mapping) -> None:
    """Checks every option of ``values`` that has a rule (others are left to their owner).

    Raises:
        ValueError: as :func:`check_option`, for the first option refused.
    """
    for option, value in values.items():
        if option in OPTION_RULES:
            check_option(option, value)


def check_threads(value: int | None, name: str = "threads") -> None:
    """Validates a CPU thread count: None or 0 (PyTorch's default) or a count up to
    :data:`MAX_THREADS`, the CPUs this process may use.

    Raises:
        ValueError: naming ``name``, the value and the maximum (``torch.set_num_threads(-1)``
            raises a RuntimeError deep inside a run otherwise, and far too many threads crash).
    """
    check_option("threads", value, name)


def check_seed(value: int | None, name: str = "seed") -> None:
    """Validates a seed, None (unset) or an integer in [0, 2**63 − 1] (what ``torch.manual_seed``
    takes: 10**20 overflowed inside PyTorch).

    Raises:
        ValueError: naming ``name``, the value and the range.
    """
    if value is not None:
        check_option("seed", value, name)


def set_threads(value: int | None, name: str = "threads") -> None:
    """Checks a CPU thread count (:func:`check_threads`) and gives it to PyTorch (None or 0: left as it is)."""
    check_threads(value, name)
    if value:
        import torch

        torch.set_num_threads(value)


def parse_seeds(text: str) -> list[int]:
    """``--seeds 0,1,2`` as distinct integers ≥ 0.

    Raises:
        ValueError: naming ``text`` otherwise.
    """
    try:
        seeds = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--seeds takes comma-separated integers, e.g. 0,1,2; got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds takes distinct integers ≥ 0, got {text!r}")
    for seed in seeds:
        check_option("seed", seed, f"--seeds {text!r}: seed")
    return seeds


def read_toml(path, what: str) -> dict:
    """The parsed TOML file ``path`` (a config file, a plan), every failure one line naming it.

    Args:
        path: the file.
        what: how messages name it (``config file``, ``plan``).

    Raises:
        ValueError: ``WHAT PATH`` and what is wrong: not a regular file (a folder, a FIFO, a
            device, a link loop: :func:`spe.paths.not_a_file`), not UTF-8 (the byte and its
            offset), not valid TOML, or nested too deeply for the reader.
    """
    import tomllib
    from pathlib import Path

    from spe.paths import not_a_file

    problem = not_a_file(path)
    if problem:
        raise ValueError(f"{what} {path} {problem}")
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{what} {path} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})") \
            from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{what} {path} is not valid TOML: {err}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ValueError(f"{what} {path} nests arrays or tables too deeply to be read") from None


def read_json_object(path, what: str) -> dict:
    """The JSON object (a dict) in the file ``path``, every failure one line naming it.

    Args:
        path: the file (e.g. an experiment folder's ``config.json``).
        what: what the file should be, for messages (``an experiment's config``).

    Raises:
        ValueError: ``PATH is not WHAT``: not UTF-8, not JSON (with the line and column), or
            JSON of another shape (a list, a number: another tool's file).
    """
    import json
    from pathlib import Path

    try:
        value = json.loads(Path(path).read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not {what}: not UTF-8 text (offset {err.start})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not {what}: not valid JSON ({err.msg} at line {err.lineno}, column "
                         f"{err.colno}); move it away or choose another --out") from None
    except RecursionError:
        raise ValueError(f"{path} is not {what}: JSON nested too deeply to be read") from None
    if not isinstance(value, dict):
        kind = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(value), "null")
        raise ValueError(f"{path} is not {what}: it holds a JSON {kind}, not an object (another "
                         "tool's file?); move it away or choose another --out")
    return value


def parse_int_list(text: str, flag: str) -> list[int]:
    """``--lengths 512,1024`` as positive integers.

    Raises:
        ValueError: naming ``flag`` and ``text`` otherwise.
    """
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} takes positive integers, got {text!r}")
    return values

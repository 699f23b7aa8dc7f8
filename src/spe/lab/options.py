"""User options decoded and checked in one place, shared by the library and the ``spe`` command.

Config files and command-line flags have no null, so some options spell "none" as 0; each
such convention is decoded once ("window 0 means None" was once decoded in three
places). The options of training (``spe train``'s :class:`~spe.lab.train.config.TrainConfig`,
``spe lra``'s :class:`~spe.lab.lra.config.LRAConfig`, config files, sweep and study rows) have one
rule each, in :data:`OPTION_RULES`, so that an option means the same and is refused the same
way whichever front end sets it, before any data is read or any model built (a
``grad_clip`` of -1 once turned ``spe train`` into gradient ascent while ``spe lra`` refused it).
No torch import: the CLI checks its flags before loading anything heavy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["OPTION_RULES", "SCHEDULES", "OptionRule", "check_option", "check_options", "check_seed", "check_threads",
           "parse_int_list", "parse_seeds", "read_toml", "set_threads"]

# The learning-rate schedules of the engine (spe.lab.train.optim.learning_rate_factor): named here,
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
        if isinstance(value, bool) or not isinstance(value, int if self.integer else int | float):
            return False
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


_POSITIVE = OptionRule(integer=True, low=1)
# torch.manual_seed and Generator.manual_seed take a signed 64-bit integer; beyond it they overflow
_SEED = OptionRule(integer=True, low=0, high=2 ** 63 - 1, text="an integer in [0, 2**63 - 1]")

# Option name -> its rule, whichever configuration has the option (an option of the same name
# means the same in every configuration).
OPTION_RULES: dict[str, OptionRule] = {
    "steps": _POSITIVE,
    "batch_size": _POSITIVE,
    "eval_every": _POSITIVE,
    "eval_batch_size": _POSITIVE,
    "keep_checkpoints": _POSITIVE,
    "seq_len": _POSITIVE,
    "max_piece_tokens": _POSITIVE,
    "test_min_tokens": OptionRule(integer=True, low=0, note="tokens; 0: no test split"),
    "num_test_pieces": _POSITIVE,
    "max_length": OptionRule(integer=True, low=1, optional=True, text="a positive integer or unset"),
    "num_realizations": OptionRule(integer=True, low=1, optional=True, text="a positive integer or unset"),
    "lr": OptionRule(integer=False, low=0, low_open=True),
    "weight_decay": OptionRule(integer=False, low=0),
    "grad_clip": OptionRule(integer=False, low=0, note="0: no clipping"),
    "min_lr_ratio": OptionRule(integer=False, low=0, high=1),
    "schedule": OptionRule(integer=False, choices=SCHEDULES),
    "positional_lr_scale": OptionRule(integer=False, low=0, low_open=True, note="1.0: the model's learning rate"),
    "val_fraction": OptionRule(integer=False, low=0, high=1, low_open=True, high_open=True),
    "warmup_steps": OptionRule(integer=True, low=0),
    "eval_examples": OptionRule(integer=True, low=0, note="0: the whole split"),
    "feature_redraw_every": OptionRule(integer=True, low=0, note="0: never"),
    "max_transpose": OptionRule(integer=True, low=0, note="semitones; 0: no transposition"),
    "seed": _SEED,
    "split_seed": _SEED,
    "threads": OptionRule(integer=True, low=0, optional=True,
                          text="0 (PyTorch's default) or a positive number of CPU threads"),
}


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
    """Validates a CPU thread count: None or 0 (PyTorch's default) or a positive count.

    Raises:
        ValueError: naming ``name`` and the value (``torch.set_num_threads(-1)`` raises a
            RuntimeError deep inside a run otherwise).
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

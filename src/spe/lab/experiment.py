"""What every experiment of the lab trains with: :class:`ExperimentOptions`, one config for the
engine's options, and ``KEY=VALUE`` overrides of a model's options (:func:`parse_model_option`).

The music language model (``spe train``: :class:`~spe.lab.music.config.TrainConfig`) and the
Long Range Arena (``spe lra``: :class:`~spe.lab.lra.config.LRAConfig`) extend this one class
with their task's data and run options. Each task class is a named preset: where its
experiments were run with another default, it redeclares that field and says why in its
docstring; every other default is this class's, so the two cannot drift apart.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# declared beside the rules of the options (no import cycle: the rule table is built from it)
from spe.lab.options import ExperimentOptions

__all__ = ["ExperimentOptions", "defaults_quiet", "model_options", "parse_model_option", "quiet_defaults"]

_QUIET = ContextVar("spe_quiet_defaults", default=False)


@contextmanager
def quiet_defaults() -> Iterator[None]:
    """Inside it, the tasks' configs fill the same model defaults without saying so: for
    configurations that are only checked (every row of a plan when it is read, the rows a
    summary lists), so that the messages name the runs that will train and nothing else."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


def defaults_quiet() -> bool:
    """Whether the caller is inside :func:`quiet_defaults`."""
    return _QUIET.get()


def parse_model_option(text: str) -> tuple[str, bool | int | float | str]:
    """``KEY=VALUE`` (``spe train`` and ``spe lra --model-option``) as ``(key, value)``: VALUE read
    as a TOML scalar (``true``, ``false``, ``64``, ``-2.5``, ``1e-3``, ``"text"``), else as the
    text itself (``spread``, ``orthogonal``).

    Only the syntax is checked here; the task's config checks the option (name, type, value).

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
    except RecursionError:  # thousands of nested arrays: no scalar either
        value = None
    if not isinstance(value, bool | int | float | str):
        raise ValueError(f"--model-option {key}: VALUE must be a number, true, false or a string, got {raw!r}")
    return key, value


def model_options(texts: list[str], *, flags: dict | None = None) -> dict:
    """Model options given on a command line as one dict: the model flags (``flags``: option name
    -> value, those given, ``decay`` included) and every ``--model-option KEY=VALUE``.

    Raises:
        ValueError: as :func:`parse_model_option`, or naming the two places that give one key
            two values (``--model-option decay='gated' contradicts --decay fixed``).
    """
    options = dict(flags or {})
    given = {key: f"--{key.replace('_', '-')} {value}" for key, value in options.items()}
    for text in texts:
        key, value = parse_model_option(text)
        if key in options and options[key] != value:
            raise ValueError(f"--model-option {key}={value!r} contradicts {given[key]}; give one value")
        options[key] = value
        given[key] = f"--model-option {key}={value!r}"
    return options

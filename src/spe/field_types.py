"""The value types a config dataclass's fields take, read from its real type hints.

One checker for every config read from TOML, the command line or a checkpoint header
(``ModelConfig``, ``ClassifierConfig``, the lab's experiment configs): it resolves the fields'
annotations with :func:`typing.get_type_hints`, so ``int | None``, ``Optional[int]`` and
``None | int`` are the same type, and an annotation it cannot check raises when the table is
built instead of letting values through unchecked.

Rules: ``bool`` is not an ``int`` here (``True`` is refused where an integer is due); a
``float`` field takes integers too; ``tuple[...]`` and ``list[...]`` fields take lists or
tuples (TOML and JSON have lists only); ``dict[...]`` takes dicts.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing

__all__ = ["check_field_types", "describe_types", "field_value_types", "value_types"]

_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a table",
          list: "a list", tuple: "a list", type(None): "unset"}


def value_types(annotation) -> tuple[type, ...]:
    """The Python types a value of ``annotation`` may have.

    Args:
        annotation: a resolved type hint (``int``, ``float | None``, ``tuple[int, int]``, ...).

    Returns:
        the accepted types, e.g. ``(int, NoneType)`` for ``int | None``, ``(int, float)`` for ``float``.

    Raises:
        TypeError: for an annotation outside the rules above (so no field goes unchecked).
    """
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return tuple(dict.fromkeys(t for arg in typing.get_args(annotation) for t in value_types(arg)))
    if annotation is type(None) or annotation is None:
        return (type(None),)
    if annotation is float:
        return (int, float)
    if annotation in (int, str, bool):
        return (annotation,)
    if annotation is dict or origin is dict:
        return (dict,)
    if annotation in (list, tuple) or origin in (list, tuple):
        return (list, tuple)
    raise TypeError(f"no value-type rule for the annotation {annotation!r}")


@functools.cache
def field_value_types(cls: type) -> dict[str, tuple[type, ...]]:
    """Field name -> the types its value may have, for the dataclass ``cls``.

    Raises:
        TypeError: if a field's annotation has no rule (:func:`value_types`).
    """
    hints = typing.get_type_hints(cls)
    table = {}
    for field in dataclasses.fields(cls):
        try:
            table[field.name] = value_types(hints[field.name])
        except TypeError as err:
            raise TypeError(f"{cls.__name__}.{field.name}: {err}") from None
    return table


def describe_types(allowed: tuple[type, ...]) -> str:
    """``(int, NoneType)`` -> ``"an integer or unset"`` (a float field's int is not named twice)."""
    return " or ".join(dict.fromkeys(_NAMES.get(t, t.__name__) for t in allowed
                                     if not (t is int and float in allowed)))


def check_field_types(values: dict, cls: type, what: str) -> None:
    """Checks each value of ``values`` against the type of the field of ``cls`` it names.

    Names that are not fields of ``cls`` are left to the caller (unknown options are refused
    there, with the list of known ones).

    Args:
        values: option name -> value (from TOML, JSON or keyword arguments).
        cls: the config dataclass.
        what: how messages name an entry, e.g. ``"training option"``, ``"model option"``.

    Raises:
        TypeError: naming the option, the value and what it must be.
    """
    table = field_value_types(cls)
    for name, value in values.items():
        allowed = table.get(name)
        if allowed is None:
            continue
        if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
            raise TypeError(f"{what} {name} must be {describe_types(allowed)}, got {value!r} "
                            f"({type(value).__name__})")

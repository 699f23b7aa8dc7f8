"""spe.field_types: one value-type checker for every config, keyed on resolved type hints."""

import dataclasses
from typing import Optional

import pytest

from spe.field_types import check_field_types, describe_types, field_value_types, value_types
from spe.lab.lra.config import LRAConfig
from spe.lab.music.config import TrainConfig
from spe.lab.engine.core import EngineSettings
from spe.models import ModelConfig
from spe.models.classifier_config import ClassifierConfig


@pytest.mark.parametrize("cls", [ModelConfig, ClassifierConfig, TrainConfig, LRAConfig, EngineSettings])
def test_every_field_of_every_config_has_a_rule(cls):
    # an annotation without a rule would raise here rather than pass its values unchecked
    table = field_value_types(cls)
    assert set(table) == {f.name for f in dataclasses.fields(cls)}
    assert all(table.values())


def test_spellings_of_one_type_are_one_type():
    assert value_types(int | None) == value_types(Optional[int]) == value_types(None | int)[::-1] == (int, type(None))
    assert value_types(float) == (int, float)
    assert value_types(tuple[int, int] | None) == (list, tuple, type(None))
    assert value_types(dict[str, int]) == (dict,)
    with pytest.raises(TypeError, match="no value-type rule"):
        value_types(complex)


@dataclasses.dataclass
class _Spelled:
    # the same types written three ways: each must be checked, none let through
    a: "int | None" = None
    b: Optional[int] = None
    c: "float" = 0.0
    d: bool = False


@pytest.mark.parametrize("name", ["a", "b"])
def test_a_differently_written_annotation_is_still_checked(name):
    with pytest.raises(TypeError, match=rf"option {name} must be an integer or unset, got 'x' \(str\)"):
        check_field_types({name: "x"}, _Spelled, "option")
    check_field_types({name: 3}, _Spelled, "option")
    check_field_types({name: None}, _Spelled, "option")


def test_bool_is_not_an_integer_but_an_integer_is_a_number():
    with pytest.raises(TypeError, match="option a must be an integer or unset, got True"):
        check_field_types({"a": True}, _Spelled, "option")
    check_field_types({"c": 2}, _Spelled, "option")
    with pytest.raises(TypeError, match="option d must be true or false, got 1"):
        check_field_types({"d": 1}, _Spelled, "option")
    assert describe_types((int, float)) == "a number"


def test_the_configs_use_it():
    with pytest.raises(ValueError, match="training option steps must be an integer"):
        TrainConfig(steps="10")
    with pytest.raises(ValueError, match="model option num_heads must be an integer"):
        TrainConfig(model={"num_heads": 2.0})
    with pytest.raises(ValueError, match="model option gated must be true or false"):
        LRAConfig(task="listops", positional="sinespe", attention="performer", model={"gated": 1})
    with pytest.raises(ValueError, match="LRA option steps must be an integer, got 1.5"):
        LRAConfig(task="listops", positional="sinespe", attention="performer", steps=1.5)

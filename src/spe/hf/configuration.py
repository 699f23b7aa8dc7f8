"""The ``transformers`` configuration of spe's models: every option of their config, flat.

:class:`SPEConfig` carries the options of a :class:`~spe.models.ModelConfig` (the decoder
language model) or a :class:`~spe.models.ClassifierConfig` (the encoder classifier), as
``spe_kind`` says, one attribute an option, written whole to ``config.json`` (never as a
difference from defaults, so a later change of a default does not change a saved model).
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, fields

from transformers import PretrainedConfig

from spe.models.classifier_config import ClassifierConfig
from spe.models.config import ModelConfig
from spe.models.decoder_lm import DecoderLM
from spe.models.encoder_classifier import EncoderClassifier

__all__ = ["KINDS", "SPEConfig"]

# spe_kind -> the spe config it carries (the checkpoint header's spe_model_kind names).
KINDS = {DecoderLM.MODEL_KIND: ModelConfig, EncoderClassifier.MODEL_KIND: ClassifierConfig}


def _options(kind: str) -> dict:
    """Option name -> default (None where the spe config has none, e.g. vocab_size) of ``kind``."""
    return {f.name: None if f.default is MISSING else f.default for f in fields(KINDS[kind])}


_ALL_OPTIONS = {name for kind in KINDS for name in _options(kind)}


def _json_value(name: str, value):
    """``value`` as config.json holds it (tuples as lists); ValueError naming ``name`` if JSON cannot hold it."""
    if isinstance(value, tuple):
        value = list(value)
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise ValueError(f"option {name} = {value!r} cannot be carried in config.json (not a JSON value)") from None
    if json.loads(text) != value or (isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"option {name} = {value!r} cannot be carried in config.json (it would read back as "
                         f"{json.loads(text)!r})")
    return value


class SPEConfig(PretrainedConfig):
    """A :class:`~transformers.PretrainedConfig` holding an spe model's options (``model_type`` "spe").

    Args:
        spe_kind: ``"decoder-lm"`` (:class:`~spe.models.ModelConfig`, for
            :class:`~spe.hf.SPEForCausalLM`) or ``"encoder-classifier"``
            (:class:`~spe.models.ClassifierConfig`, for :class:`~spe.hf.SPEForSequenceClassification`).
        **kwargs: the spe config's options by name (missing ones: its defaults), and
            :class:`~transformers.PretrainedConfig`'s own. ``tie_word_embeddings`` follows
            ``tie_embeddings``; a classifier's ``num_labels`` is its ``num_classes``.
        use_cache: whether the causal LM decodes from its recurrent state (:class:`~spe.hf.SPECache`).

    Raises:
        ValueError: for an unknown ``spe_kind``, an option of the other kind, a value JSON
            cannot hold, or a ``num_labels`` other than ``num_classes``. The options themselves
            are checked when a model is built (:meth:`spe_config`).
    """

    model_type = "spe"

    def __init__(self, spe_kind: str = DecoderLM.MODEL_KIND, use_cache: bool = True, **kwargs) -> None:
        if spe_kind not in KINDS:
            raise ValueError(f"spe_kind must be one of {', '.join(KINDS)}, got {spe_kind!r}")
        options = _options(spe_kind)
        foreign = sorted(name for name in kwargs if name in _ALL_OPTIONS and name not in options)
        if foreign:
            raise ValueError(f"option {foreign[0]} is not an option of spe_kind {spe_kind!r} "
                             f"({KINDS[spe_kind].__name__})")
        values = {name: _json_value(name, kwargs.pop(name, default)) for name, default in options.items()}
        kwargs["tie_word_embeddings"] = bool(values.get("tie_embeddings", False))
        classifier = spe_kind == EncoderClassifier.MODEL_KIND
        if classifier and "num_labels" not in kwargs and "id2label" not in kwargs:
            kwargs["num_labels"] = values["num_classes"]
        super().__init__(**kwargs)
        self.spe_kind = spe_kind
        self.use_cache = use_cache
        for name, value in values.items():
            setattr(self, name, value)
        if classifier and self.num_labels != self.num_classes:
            raise ValueError(f"num_labels ({self.num_labels}) must equal num_classes ({self.num_classes}), the "
                             "classifier's outputs")

    @property
    def option_names(self) -> tuple[str, ...]:
        """The spe options this config carries (the fields of its spe config)."""
        return tuple(_options(self.spe_kind))

    def spe_config(self) -> ModelConfig | ClassifierConfig:
        """The spe config of these options (a new object each call).

        Raises:
            ValueError: as the spe config does, for an option it refuses (one line naming it).
        """
        return KINDS[self.spe_kind].from_dict({name: getattr(self, name) for name in self.option_names})

    @classmethod
    def from_spe(cls, config: ModelConfig | ClassifierConfig, **kwargs) -> SPEConfig:
        """The SPEConfig carrying every option of ``config``.

        Args:
            config: a :class:`~spe.models.ModelConfig` or :class:`~spe.models.ClassifierConfig`.
            **kwargs: :class:`~transformers.PretrainedConfig`'s own options.

        Raises:
            TypeError: for another kind of config.
            ValueError: naming the first option whose value config.json cannot hold.
        """
        kind = next((k for k, c in KINDS.items() if type(config) is c), None)
        if kind is None:
            raise TypeError(f"config must be a ModelConfig or a ClassifierConfig, got {type(config).__name__}")
        values = {f.name: getattr(config, f.name) for f in fields(config)}
        return cls(spe_kind=kind, **values, **kwargs)

    def to_diff_dict(self) -> dict:
        """As :meth:`PretrainedConfig.to_diff_dict`, with ``spe_kind`` and every spe option
        always written (their defaults may change between versions of spe)."""
        values = super().to_diff_dict()
        values.update({"spe_kind": self.spe_kind, **{name: getattr(self, name) for name in self.option_names}})
        return values

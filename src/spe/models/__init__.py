"""Models: one trunk (:class:`Trunk`, :class:`TrunkConfig`) under two heads, the language model
(:class:`DecoderLM`, :class:`ModelConfig`) and the classifier (:class:`EncoderClassifier`,
:class:`ClassifierConfig`)."""

from spe.models.block import Block
from spe.models.classifier_config import ClassifierConfig
from spe.models.config import ModelConfig
from spe.models.decoder_lm import DecoderLM, DecodingState
from spe.models.encoder_classifier import EncoderClassifier
from spe.models.trunk import Trunk
from spe.models.trunk_config import POSITIONALS, TrunkConfig

__all__ = ["POSITIONALS", "Block", "ClassifierConfig", "DecoderLM", "DecodingState", "EncoderClassifier",
           "ModelConfig", "Trunk", "TrunkConfig"]

"""Models."""

from spe.models.block import Block
from spe.models.classifier_config import ClassifierConfig
from spe.models.config import POSITIONALS, ModelConfig
from spe.models.decoder_lm import DecoderLM, DecodingState
from spe.models.encoder_classifier import EncoderClassifier

__all__ = ["POSITIONALS", "Block", "ClassifierConfig", "DecoderLM", "DecodingState", "EncoderClassifier",
           "ModelConfig"]

"""Models."""

from spe.models.block import Block
from spe.models.config import POSITIONALS, ModelConfig
from spe.models.decoder_lm import DecoderLM, DecodingState

__all__ = ["POSITIONALS", "Block", "DecoderLM", "DecodingState", "ModelConfig"]

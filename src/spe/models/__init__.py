"""Models."""

from spe.models.config import POSITIONALS, ModelConfig
from spe.models.decoder_lm import Block, DecoderLM, DecodingState

__all__ = ["POSITIONALS", "Block", "DecoderLM", "DecodingState", "ModelConfig"]

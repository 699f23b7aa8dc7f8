"""Models."""

from spe.models.config import POSITIONALS, ModelConfig
from spe.models.decoder_lm import Block, DecoderLM, DecodingState

__all__ = ["Block", "DecoderLM", "DecodingState", "ModelConfig", "POSITIONALS"]

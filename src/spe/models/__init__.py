"""Models."""

from spe.models.config import POSITIONALS, ModelConfig
from spe.models.decoder_lm import Block, DecoderLM

__all__ = ["Block", "DecoderLM", "ModelConfig", "POSITIONALS"]

"""spe: relative positional encoding for linear-complexity Transformers.

Stochastic Positional Encoding (Liutkus, Cífka, Wu, Şimşekli, Yang, Richard, ICML 2021).
The core (encodings, attention, models) depends on torch only.
"""

from spe.attention import ATTENTIONS, MultiHeadAttention
from spe.checkpoint import load, save
from spe.encodings import ConvSPE, DenseCode, SineCode, SineSPE, SinusoidalPositionalEncoding, SPEFilter
from spe.models import POSITIONALS, DecoderLM, ModelConfig

__version__ = "0.1.0"

__all__ = [
    "ATTENTIONS", "POSITIONALS", "ConvSPE", "DecoderLM", "DenseCode", "ModelConfig", "MultiHeadAttention",
    "SPEFilter", "SineCode", "SineSPE", "SinusoidalPositionalEncoding", "load", "save",
]

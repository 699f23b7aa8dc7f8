"""spe: relative positional encoding for linear-complexity Transformers.

Stochastic Positional Encoding (Liutkus, Cífka, Wu, Şimşekli, Yang, Richard, ICML 2021).
The core (encodings, attention, models) depends on torch only; ``import spe`` loads no part
of the lab (:mod:`spe.lab`: data, training, experiments, the command line).

What ``spe`` exports, by where it sits:

* encodings: :class:`SineSPE`, :class:`ConvSPE` (SPE codes), applied to queries and keys by
  :class:`SPEFilter`; :class:`RotaryEncoding`, :class:`SinusoidalPositionalEncoding`;
* kernels (layout (batch, length, num_heads, dim)): :func:`causal_linear_attention`,
  :func:`causal_linear_attention_with_state`, :func:`linear_attention`,
  :func:`linear_attention_step`, :func:`softmax_attention`, and the FAVOR+ features
  (:func:`orthogonal_random_features`, :func:`favor_feature_map`, :func:`favor_key_features`,
  whose :class:`ScaledFeatures` every linear kernel takes as its keys);
* the layer :class:`MultiHeadAttention`; the models :class:`DecoderLM` (:class:`ModelConfig`)
  and :class:`EncoderClassifier` (:class:`ClassifierConfig`);
* :func:`save`, :func:`load` (a :class:`LoadedCheckpoint`) and :func:`generate`.
"""

from spe.attention import ATTENTIONS, MultiHeadAttention
from spe.checkpoint import LoadedCheckpoint, load, save
from spe.encodings import (
    ConvSPE,
    DenseCode,
    RotaryEncoding,
    SineCode,
    SineSPE,
    SinusoidalPositionalEncoding,
    SPEFilter,
)
from spe.generation import generate
from spe.models import POSITIONALS, ClassifierConfig, DecoderLM, EncoderClassifier, ModelConfig
from spe.ops import (
    ScaledFeatures,
    causal_linear_attention,
    causal_linear_attention_with_state,
    favor_feature_map,
    favor_key_features,
    linear_attention,
    linear_attention_step,
    orthogonal_random_features,
    softmax_attention,
)

__version__ = "0.1.0"

__all__ = [
    # encodings
    "ConvSPE", "DenseCode", "RotaryEncoding", "SPEFilter", "SineCode", "SineSPE", "SinusoidalPositionalEncoding",
    # kernels and feature maps
    "ScaledFeatures", "causal_linear_attention", "causal_linear_attention_with_state", "favor_feature_map",
    "favor_key_features", "linear_attention", "linear_attention_step", "orthogonal_random_features",
    "softmax_attention",
    # layer, models, configs
    "ATTENTIONS", "POSITIONALS", "ClassifierConfig", "DecoderLM", "EncoderClassifier", "ModelConfig",
    "MultiHeadAttention",
    # checkpoints and sampling
    "LoadedCheckpoint", "generate", "load", "save",
]

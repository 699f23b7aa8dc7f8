"""Attention layers, the registry of attention kernels and the registry of decays."""

from spe.attention.decays import DECAYS, LayerDecay
from spe.attention.kernels import KERNELS, FeatureTransform, KernelFeatures, KernelOptions, KernelSpec, kernel_spec
from spe.attention.layer import ATTENTIONS, MultiHeadAttention
from spe.attention.pro import PRO_OPTIONS, FoxPro, ShiftState

__all__ = ["ATTENTIONS", "DECAYS", "KERNELS", "LayerDecay", "PRO_OPTIONS", "FeatureTransform", "FoxPro",
           "KernelFeatures", "KernelOptions", "KernelSpec", "MultiHeadAttention", "ShiftState", "kernel_spec"]

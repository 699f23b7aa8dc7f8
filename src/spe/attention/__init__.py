"""Attention layers and the registry of attention kernels."""

from spe.attention.kernels import KERNELS, FeatureTransform, KernelFeatures, KernelOptions, KernelSpec, kernel_spec
from spe.attention.layer import ATTENTIONS, MultiHeadAttention

__all__ = ["ATTENTIONS", "KERNELS", "FeatureTransform", "KernelFeatures", "KernelOptions", "KernelSpec",
           "MultiHeadAttention", "kernel_spec"]

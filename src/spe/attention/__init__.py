"""Attention layers."""

from spe.attention.layer import ATTENTIONS, MultiHeadAttention

__all__ = ["ATTENTIONS", "MultiHeadAttention"]

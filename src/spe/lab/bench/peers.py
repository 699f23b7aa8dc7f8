"""Attention layers of other packages, measured beside ours when installed (optional rows).

``performer-pytorch`` (lucidrains, PyPI ``performer-pytorch``, pure PyTorch): its causal
FAVOR+ self-attention with projections, B = batch, N = length, C = H·D model width. On CPU
it uses ``causal_linear_attention_noncuda`` (prefix sums over N/128-position slices holding
a (B, H, N/128, M, D) context each); it has no recurrent decoding step.
"""

from __future__ import annotations

import contextlib
import io

from torch import Tensor, nn

__all__ = ["PEER_ATTENTIONS", "build_peer_layer"]

# bench attention name -> the PyPI package that provides it
PEER_ATTENTIONS = {"performer-pytorch": "performer-pytorch"}


class _PeerLayer(nn.Module):
    """Takes (x, code) like MultiHeadAttention, ignores the (absent) SPE code."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, x: Tensor, code=None) -> Tensor:
        return self.attention(x)


def build_peer_layer(name: str, num_heads: int, head_dim: int, num_features: int) -> nn.Module:
    """A causal self-attention layer of another package, (B, N, C) → (B, N, C).

    Raises:
        ValueError: on an unknown peer name.
        ImportError: when the package is not installed (the bench records the row as skipped).
    """
    if name not in PEER_ATTENTIONS:
        raise ValueError(f"unknown peer attention {name!r}; choose one of {', '.join(PEER_ATTENTIONS)}")
    # it prints a notice about its missing CUDA kernel; the worker's stdout carries its JSON
    with contextlib.redirect_stdout(io.StringIO()):
        from performer_pytorch import SelfAttention

        attention = SelfAttention(dim=num_heads * head_dim, heads=num_heads, dim_head=head_dim, causal=True,
                                  nb_features=num_features)
    return _PeerLayer(attention)

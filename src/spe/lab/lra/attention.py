"""The CLS query's attention over an image grid, per head (the paper's Figure 13).

Letters: B = batch, L = length with the CLS token, H = num_heads, E = kernel dimension,
M = features, Y × X = grid.

The weights are the ones the layer's own kernel applies
(:meth:`~spe.attention.MultiHeadAttention.attention_weights`): softmax(q·k/√E) with the layer's
score term for softmax attention, φ(q_CLS)ᵀφ(k_n) / Σ_n φ(q_CLS)ᵀφ(k_n) for linear kernels
(FAVOR+ with its key scales, decays and gates included), padding keys excluded. The layer's
input is captured with a forward pre-hook.
"""

from __future__ import annotations

import operator
from pathlib import Path

import torch
from torch import Tensor

from spe.models.encoder_classifier import EncoderClassifier

__all__ = ["cls_attention", "plot_cls_attention"]


def _capture(model: EncoderClassifier, layer: int, tokens: Tensor, lengths: Tensor | None):
    blocks = model.blocks
    try:
        layer = operator.index(layer)
    except TypeError:
        raise TypeError(f"layer must be an integer, got {layer!r}") from None
    if not -len(blocks) <= layer < len(blocks):
        raise ValueError(f"layer must lie in [-{len(blocks)}, {len(blocks)}) for this model, got {layer}")
    seen = {}

    def hook(module, args, kwargs):
        seen["x"], seen["code"] = args[0], args[1] if len(args) > 1 else kwargs.get("code")
        seen["positions"], seen["mask"] = kwargs.get("positions"), kwargs.get("key_padding_mask")

    attn = blocks[layer].attn
    handle = attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        model.encode(tokens, lengths)
    finally:
        handle.remove()
    return attn, seen


@torch.no_grad()
def cls_attention(model: EncoderClassifier, tokens: Tensor, lengths: Tensor | None = None, *,
                  layer: int = -1) -> Tensor:
    """Attention weights of the CLS query (position 0) over every position.

    Args:
        model: an encoder classifier with ``pooling="cls"``.
        tokens: (B, L − 1) ids (without the CLS token, which the model prepends).
        lengths: (B,) real tokens per sequence (default: all).
        layer: block index (negative from the last).

    Returns:
        (B, H, L) weights, 0 at padding (CLS itself at index 0), in the layer's kernel dtype
        (at least float32). They sum to 1 over the real positions, except where the layer's
        kernel does not normalise them so: ``linear`` (no denominator), RoPE or another numerator-only transform with a
        linear kernel (the denominator keeps the unrotated features), ReLU features of a CLS
        query that meet no key (all 0).

    Raises:
        ValueError: if the model does not pool at a CLS token, or on a bad layer.
    """
    if model.config.pooling != "cls":
        raise ValueError(f"the model pools with {model.config.pooling!r}: it has no CLS query")
    was_training = model.training
    model.eval()
    try:
        attn, seen = _capture(model, layer, tokens, lengths)
    finally:
        model.train(was_training)
    weights = attn.attention_weights(seen["x"], seen["code"], positions=seen["positions"],
                                     key_padding_mask=seen["mask"])  # (B, H, L, L)
    return weights[:, :, 0]


def plot_cls_attention(weights: Tensor, grid: tuple[int, int], png: str | Path, *, images: Tensor | None = None,
                       title: str = "") -> Path:
    """Draws each example's image (if given) and its CLS attention map per head on the grid.

    Args:
        weights: (B, H, 1 + Y·X) from :func:`cls_attention` (the CLS column is dropped).
        grid: (Y, X).
        png: output file.
        images: (B, Y·X) pixel token ids, drawn in grey beside the maps.
        title: figure title.

    Returns:
        The file written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cols = grid
    b, h, _ = weights.shape
    extra = int(images is not None)
    fig, axes = plt.subplots(b, h + extra, figsize=(1.8 * (h + extra), 1.8 * b), squeeze=False)
    for i in range(b):
        if images is not None:
            axes[i, 0].imshow(images[i, :rows * cols].reshape(rows, cols).cpu(), cmap="gray")
        for j in range(h):
            axes[i, j + extra].imshow(weights[i, j, 1:].reshape(rows, cols).cpu(), cmap="viridis")
            if i == 0:
                axes[i, j + extra].set_title(f"head {j}", fontsize=8)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=80)
    plt.close(fig)
    return png

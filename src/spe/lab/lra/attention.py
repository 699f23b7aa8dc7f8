"""The CLS query's attention over an image grid, per head (the paper's Figure 13).

Letters: B = batch, L = length with the CLS token, H = num_heads, E = kernel dimension,
M = features, Y × X = grid.

The weights are the ones the layer's own kernel applies: softmax(q·k/√E) for softmax
attention, φ(q_CLS)ᵀφ(k_n) / Σ_n φ(q_CLS)ᵀφ(k_n) for linear kernels (FAVOR+ with its key
scales), padding keys excluded. The layer's input is captured with a forward pre-hook and
its own projection (and SPE filter) forms q and k.
"""

from __future__ import annotations

import math
import operator
from pathlib import Path

import torch
from torch import Tensor

from spe.models.encoder_classifier import EncoderClassifier
from spe.ops.linear import rescale_keys

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
        (B, H, L) weights summing to 1 over the real positions (CLS itself at index 0).

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
    q, k, _ = attn.project(seen["x"], seen["code"])  # (B, L, H, E)
    mask = seen["mask"]
    if attn.kernel.feature_map is None:  # softmax: the weights themselves
        if attn.rotary is not None:
            q, k = attn.rotary(q.float(), seen["positions"]), attn.rotary(k.float(), seen["positions"])
        term = attn.score_encoding
        if term is not None and hasattr(term, "weights"):  # an SPE oracle: its scores depend on the keys
            return term.weights(q[:, :1].float(), k.float(), key_padding_mask=mask)[:, :, 0]
        scores = torch.einsum("bhe,blhe->bhl", q[:, 0].float(), k.float()) / q.shape[-1] ** 0.5
        if term is not None:  # Shaw, Music Transformer, ALiBi: their term for the query at position 0
            scores = scores + term.score_bias(q[:, :1].float(), k.shape[1])[:, :, 0]
        return torch.softmax(scores.masked_fill(mask[:, None], float("-inf")), dim=-1)
    fq, fk, extra = attn._linear_inputs(q, k, seen["positions"])  # noqa: SLF001 - the layer's own features
    if "normalizer" in extra:  # RoPE: the unrotated features give the (positive) weights' normaliser
        fq, fk = extra["normalizer"]
    log_decay = attn.log_decay(seen["x"], mask)
    if log_decay is not None:  # the CLS query sits at position 0, so key n weighs γ^n (γ^|m−n| of encoders)
        if log_decay.dim() == 1:
            lags = torch.arange(fk.shape[1], device=fk.device, dtype=torch.float32)[:, None] * log_decay  # (L, H)
        else:  # a gate: key n weighs exp(Σ_{0<t≤n} G_t), (B, L, H) or per channel (B, L, H, M)
            lags = torch.cat([torch.zeros_like(log_decay[:, :1]), log_decay[:, 1:].cumsum(1)], dim=1)
        if lags.dim() == 4:
            fk = fk * torch.exp(lags)
        else:
            extra["key_log_scale"] = extra.get("key_log_scale", torch.zeros(fk.shape[:3], device=fk.device)) + lags
    if "key_log_scale" in extra:  # padding at −∞, so it can never be the common scale (as in the kernel)
        fk, _ = rescale_keys(fk, None, extra["key_log_scale"].masked_fill(mask[..., None], -math.inf))
    weights = torch.einsum("bhm,blhm->bhl", fq[:, 0].float(), fk.float()).masked_fill(mask[:, None], 0.0)
    return weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)


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

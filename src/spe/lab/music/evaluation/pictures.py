"""The paper's pictures: learned kernels, attention maps, piano rolls, R ablation, style similarity.

* :func:`plot_kernels`: learned positional templates (Figure 7 of Liutkus et al. 2021).
* :func:`plot_attention`: full attention matrices computed offline (Figures 8-12), from
  :func:`spe.lab.metrics.capture.attention_matrices`.
* :func:`plot_piano_roll`: a generated piece, prompt marked.
* :func:`plot_r_grid`: cross-entropy for trained R × test R (Figure 14's layout).
* :func:`plot_style_similarity`: prompt-to-continuation style similarity per part (Figure 5).

Every figure has a title, axis labels with units and a colour bar where colours carry values;
PNGs are written atomically (:func:`spe.checkpoint.atomic_write`). Needs the ``music`` extra
(matplotlib, numpy; symusic for piano rolls). Letters: H = num_heads, D = head_dim,
L = length, T = lags.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from spe.checkpoint import atomic_write
from spe.encodings.registry import positional_names, positional_spec
from spe.lab.metrics.capture import layer_index, attention_matrices

if TYPE_CHECKING:
    from spe.models.decoder_lm import DecoderLM

__all__ = ["effective_kernels", "plot_attention", "plot_kernels", "plot_piano_roll", "plot_r_grid",
           "plot_style_similarity"]

_SCALES = ("power", "log", "linear")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | os.PathLike) -> Path:
    plt = _pyplot()
    path = Path(path)
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    finally:
        plt.close(fig)
    return path


def _grid(n: int, max_cols: int = 4) -> tuple[int, int]:
    cols = min(n, max_cols)
    return math.ceil(n / cols), cols


@torch.no_grad()
def effective_kernels(model: DecoderLM, *, max_lag: int | None = None, layer: int = 0) -> tuple[np.ndarray, bool, int]:
    """The values :func:`plot_kernels` draws: (1 − δ_hd) · P_hd(τ) + δ_hd for τ = −max_lag … max_lag.

    Returns:
        ((H, D, 2·max_lag + 1) float64 values, whether a gate was applied, the 0-based layer).

    Raises:
        ValueError: as :func:`plot_kernels`.
    """
    positional = model.config.positional
    if not positional_spec(positional).stochastic:
        raise ValueError(f"plot_kernels needs an SPE model (positional "
                         f"{' or '.join(positional_names(stochastic=True, needs_grid=False))}), got positional {positional!r}")
    max_lag = 128 if max_lag is None else int(max_lag)
    if max_lag < 1:
        raise ValueError(f"max_lag must be a positive number of positions, got {max_lag}")
    layer = layer_index(layer, len(model.blocks))
    lags = torch.arange(-max_lag, max_lag + 1, device=next(model.parameters()).device)
    kernel = model.layer_encoding(layer).kernel(lags).double()  # (H, D, T)
    gate = model.blocks[layer].attn.spe_filter.gate
    if gate is not None:
        gate = gate.double()[..., None]  # (H, D, 1)
        kernel = (1 - gate) * kernel + gate
    return kernel.detach().cpu().numpy(), gate is not None, layer


def plot_kernels(model: DecoderLM, path: str | os.PathLike, *, max_lag: int | None = None,
                 layer: int = 0) -> np.ndarray:
    """Learned positional templates of an SPE model (Figure 7): one image per head.

    Pixel (d, τ) of head h is the effective kernel that layer ``layer`` applies between a
    query and a key τ = m − n positions apart, in expectation over the SPE noise::

        (1 − δ_hd) · P_hd(τ) + δ_hd

    P from the layer's encoding's exact ``kernel(lags)`` (shared by all layers unless
    ``share_across_layers`` is off), δ the layer's gate
    (eq. (23)-(25); δ = 0 for an ungated model). Only τ >= 0 is used by causal attention;
    negative lags are shown too, as in the paper's full templates.

    Args:
        model: a DecoderLM with ``sinespe`` or ``convspe``.
        path: PNG file to write.
        max_lag: lags −max_lag … max_lag (default 128; the report passes the training length).
        layer: block whose gate is applied, 0-based (negative counts from the end).

    Returns:
        (H, D, 2·max_lag + 1) float64 array: the plotted values, column j is lag j − max_lag.

    Raises:
        ValueError: for a model without SPE, a non-positive ``max_lag`` or a missing layer.
    """
    values, gated, layer = effective_kernels(model, max_lag=max_lag, layer=layer)
    max_lag = (values.shape[-1] - 1) // 2
    num_heads, head_dim = values.shape[:2]
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    rows, cols = _grid(num_heads)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows + 0.6), squeeze=False)
    limit = float(np.abs(values).max()) or 1.0  # a shared, symmetric scale: 0 is white in every panel
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= num_heads:
            ax.axis("off")
            continue
        image = ax.imshow(values[h], aspect="auto", origin="lower", cmap="RdBu_r", vmin=-limit, vmax=limit,
                          extent=(-max_lag - 0.5, max_lag + 0.5, -0.5, head_dim - 0.5), interpolation="nearest")
        ax.set_title(f"head {h + 1}")
        ax.set_xlabel("lag τ = m − n (positions)")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if h % cols == 0:
            ax.set_ylabel("feature d")
    gated = "(1 − δ)·P(τ) + δ" if gated else "P(τ), ungated"
    fig.suptitle(f"{model.config.positional}: effective positional kernel {gated}, layer {layer + 1}",
                 fontsize=10)
    fig.tight_layout()
    fig.colorbar(image, ax=axes.ravel().tolist(), label="kernel value (expected q̂·k̂ weight)")
    _save(fig, path)
    return values


def _attention_maps(model: DecoderLM, tokens, layers, heads) -> tuple[dict[int, np.ndarray], list[int], list[int]]:
    """{layer: (H, L, L)} for the distinct layers asked for, those layers and the heads (0-based)."""
    num_layers = len(model.blocks)
    chosen = list(dict.fromkeys(layer_index(i, num_layers) for i in layers))
    if not chosen:
        raise ValueError("layers must name at least one layer")
    maps = {i: attention_matrices(model, tokens, layer=i).numpy() for i in chosen}
    num_heads = model.config.num_heads
    heads = list(range(num_heads)) if heads is None else list(heads)
    if not heads or any(not 0 <= h < num_heads for h in heads):
        raise ValueError(f"heads must be indices in [0, {num_heads}), got {heads}")
    return maps, chosen, heads


def plot_attention(model: DecoderLM, tokens, path: str | os.PathLike, *, layers=(0, -1),
                   heads=None, scale: str = "power", training_length: int | None = None) -> dict[int, np.ndarray]:
    """Full attention matrices of chosen layers and heads (Figures 8-12), one image each.

    Args:
        model: a DecoderLM.
        tokens: (L,) token ids of the sequence to look at.
        path: PNG file to write.
        layers: block indices, 0-based (negative from the end); duplicates are drawn once.
        heads: head indices, 0-based (default all).
        scale: colour scale: ``power`` (the paper's min{1, a^0.4 / 0.02^0.4}), ``log``
            (10⁻⁴ … 1) or ``linear`` (0 … 1).
        training_length: if given, dashed lines mark this position on both axes.

    Returns:
        {layer: (H, L, L) attention} for the layers drawn (0-based keys); titles number layers
        and heads from 1, as the paper does.

    Raises:
        ValueError: on an unknown scale, a missing layer or head, or what
            :func:`attention_matrices` refuses.
    """
    from matplotlib.colors import LogNorm, Normalize, PowerNorm

    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {', '.join(_SCALES)}, got {scale!r}")
    maps, chosen, heads = _attention_maps(model, tokens, layers, heads)
    norm = {"power": lambda: PowerNorm(gamma=0.4, vmin=0.0, vmax=0.02, clip=True),
            "log": lambda: LogNorm(vmin=1e-4, vmax=1.0, clip=True),
            "linear": lambda: Normalize(vmin=0.0, vmax=1.0)}[scale]
    plt = _pyplot()
    fig, axes = plt.subplots(len(chosen), len(heads), figsize=(2.6 * len(heads) + 1.2, 2.5 * len(chosen) + 0.6),
                             squeeze=False)
    length = next(iter(maps.values())).shape[-1]
    for r, layer in enumerate(chosen):
        for c, h in enumerate(heads):
            ax = axes[r][c]
            a = maps[layer][h]
            # Masked (future) entries are NaN, drawn blank rather than as attention 0.
            shown = np.where(np.tri(length, dtype=bool), a, np.nan)
            image = ax.imshow(shown, cmap="viridis", norm=norm(), interpolation="nearest",
                              extent=(-0.5, length - 0.5, length - 0.5, -0.5))
            if training_length is not None and training_length < length:
                for line in (ax.axvline, ax.axhline):
                    line(training_length - 0.5, color="0.4", ls="--", lw=0.7)
            ax.set_title(f"layer {layer + 1}, head {h + 1}", fontsize=9)
            ax.set_xlabel("key position n")
            ax.set_ylabel("query position m")
    how = {"power": "colour min{1, (a/0.02)^0.4}", "log": "log colour", "linear": "linear colour"}[scale]
    mark = f"; dashed: training length {training_length}" if training_length is not None else ""
    fig.suptitle(f"{model.config.positional}/{model.config.attention}: softmax attention on {length} tokens\n"
                 f"({how}{mark})", fontsize=10)
    fig.tight_layout()
    saturated = {"power": " (≥ 0.02 saturates)", "log": " (≤ 1e-4 floors)", "linear": ""}[scale]
    fig.colorbar(image, ax=axes.ravel().tolist(), label=f"attention weight a_mn{saturated}")
    _save(fig, path)
    return maps


def plot_piano_roll(midi, path: str | os.PathLike, *, title: str | None = None,
                    prompt_end: float | None = None) -> Path:
    """Piano roll of a piece: one bar per note, one colour per track.

    Args:
        midi: a ``symusic.Score`` or a path to a MIDI file.
        path: PNG file to write.
        title: figure title (default: the file name or "piano roll").
        prompt_end: if given, a vertical line at this time (beats) marks the end of the prompt.

    Returns:
        The PNG path.

    Raises:
        ValueError: if a MIDI file cannot be read (naming it).
        TypeError: if ``midi`` is neither a Score nor a path.
    """
    from spe.lab.metrics.style import _load

    score = _load(midi)
    tpq = score.tpq
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    colours = plt.get_cmap("tab10")
    low, high = 127, 0
    for i, track in enumerate(score.tracks):
        notes = track.notes.numpy()
        if len(notes["time"]) == 0:
            continue
        label = "drums" if track.is_drum else f"program {track.program}"
        # One horizontal bar per note, all of a track in one call (thousands of notes stay fast).
        ax.barh(notes["pitch"], notes["duration"] / tpq, left=notes["time"] / tpq, height=0.8,
                color=colours(i % 10), label=f"track {i + 1}: {label}")
        low, high = min(low, int(notes["pitch"].min())), max(high, int(notes["pitch"].max()))
    end = score.end() / tpq
    if high < low:
        ax.text(0.5, 0.5, "no notes", transform=ax.transAxes, ha="center")
        low, high = 48, 72
    if prompt_end is not None:
        ax.axvline(prompt_end, color="black", ls="--", lw=1, label="end of prompt")
    ax.set_xlim(0, max(end, prompt_end or 0.0, 1.0))
    ax.set_ylim(low - 2, high + 2)
    ax.set_xlabel("time (beats, quarter notes)")
    ax.set_ylabel("MIDI pitch")
    ax.set_title(title or (Path(midi).name if isinstance(midi, (str, os.PathLike)) else "piano roll"))
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def _matrix(grid: dict, key: str, shape: tuple[int, int]) -> np.ndarray:
    try:
        values = np.asarray(grid[key], dtype=np.float64)
    except KeyError:
        raise ValueError(f"R grid needs a {key!r} entry (rows = trained R, columns = test R)") from None
    if values.shape != shape:
        raise ValueError(f"R grid {key!r} must have shape (len(trained), len(test)) = {shape}, "
                         f"got {values.shape}")
    return values


def plot_r_grid(grid: dict, path: str | os.PathLike) -> Path:
    """Cross-entropy for each trained R (rows) and test R (columns), Figure 14's layout.

    Two panels: cross-entropy within and beyond the training length, each cell annotated;
    cells with R_test = R_train are in bold, as in the paper. Darker is worse (lower
    cross-entropy is better).

    Args:
        grid: ``{"label": str, "trained": [R...], "test": [R...], "within": (rows, cols),
            "beyond": (rows, cols)}``, values in nats/token (NaN: not measured).
        path: PNG file to write.

    Returns:
        The PNG path.

    Raises:
        ValueError: if an entry is missing or a matrix does not match the R lists.
    """
    trained, test = list(grid.get("trained", [])), list(grid.get("test", []))
    if not trained or not test:
        raise ValueError(f"R grid needs non-empty 'trained' and 'test' lists, got {trained} and {test}")
    panels = [("within", "within the training length"), ("beyond", "beyond the training length")]
    values = {key: _matrix(grid, key, (len(trained), len(test))) for key, _ in panels}
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(1.3 * len(test) * 2 + 3, 0.7 * len(trained) + 2.4), squeeze=False)
    for ax, (key, name) in zip(axes[0], panels):
        v = values[key]
        finite = v[np.isfinite(v)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        image = ax.imshow(v, cmap="viridis_r", vmin=lo, vmax=hi if hi > lo else lo + 1e-9, aspect="auto")
        for i, rt in enumerate(trained):
            for j, rs in enumerate(test):
                text = "n/a" if not math.isfinite(v[i, j]) else f"{v[i, j]:.3f}"
                shade = (v[i, j] - lo) / (hi - lo) if hi > lo and math.isfinite(v[i, j]) else 0.0
                ax.text(j, i, text, ha="center", va="center", fontsize=9, color="white" if shade > 0.5 else "black",
                        fontweight="bold" if rt == rs else "normal")
        ax.set_xticks(range(len(test)), [str(r) for r in test])
        ax.set_yticks(range(len(trained)), [str(r) for r in trained])
        ax.set_xlabel("R at test time (realisations)")
        ax.set_ylabel("R at training time (realisations)")
        ax.set_title(f"{name}")
        # Plain tick labels: an offset ("+6.2") would collide with the title when values are close.
        fig.colorbar(image, ax=ax, label="cross-entropy (nats/token)", format="%.3f")
    fig.suptitle(f"{grid.get('label', 'SPE')}: validation cross-entropy by R\n(lower is better; bold: "
                 "R_test = R_train)", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


_PROFILES = (("onset_duration", "onset-duration profile"), ("time_pitch", "time-pitch profile"))


def plot_style_similarity(rows: list[dict], path: str | os.PathLike) -> Path:
    """Style similarity of each part of a continuation to its prompt, one line per model (Figure 5).

    Args:
        rows: one dict per model: ``label`` and, for each profile, ``onset_duration`` and
            ``time_pitch``: cosine similarities (in [0, 1]) of parts 1 … P of the continuation
            (successive parts of equal duration) to the prompt.
        path: PNG file to write.

    Returns:
        The PNG path.

    Raises:
        ValueError: if ``rows`` is empty, a row lacks a key, or rows differ in their number of parts.
    """
    if not rows:
        raise ValueError("plot_style_similarity needs at least one row (model)")
    parts = set()
    for row in rows:
        missing = [k for k in ("label", *(key for key, _ in _PROFILES)) if k not in row]
        if missing:
            raise ValueError(f"style-similarity row {row.get('label', row)!r} lacks {', '.join(missing)}")
        parts |= {len(row[key]) for key, _ in _PROFILES}
    if len(parts) != 1 or 0 in parts:
        raise ValueError(f"every row must give the same, non-zero number of parts, got {sorted(parts)}")
    num_parts = parts.pop()
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    x = np.arange(1, num_parts + 1)
    for ax, (key, name) in zip(axes, _PROFILES):
        for row in rows:
            ax.plot(x, row[key], marker="o", label=row["label"])
        ax.set_xticks(x)
        ax.set_xlabel(f"part of the continuation (1 … {num_parts}, equal durations)")
        ax.set_title(name)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cosine similarity to the prompt (higher: closer style)")
    axes[-1].legend(fontsize=8)
    fig.suptitle("Style similarity of the continuation to its prompt")
    fig.tight_layout()
    return _save(fig, path)

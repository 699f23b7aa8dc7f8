"""The language model's configuration: the trunk's options and the decoder's own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

from spe.attention.fourier import MIXERS
from spe.attention.kernels import KERNELS
from spe.encodings.positions import require_positive
from spe.encodings.registry import POSITIONAL_SPECS, encodings_reading
from spe.models.trunk_config import POSITIONALS, TrunkConfig

__all__ = ["KERNEL_OPTIONS", "ModelConfig", "check_options_apply", "decode_window"]

# The trunk's options that only some kernels read, and which: FAVOR+'s random features, the
# chunks of causal linear attention (softmax forms its scores whole or in its own blocks).
KERNEL_OPTIONS = {"num_features": tuple(name for name, k in KERNELS.items() if k.random_features),
                  "chunk_size": tuple(name for name, k in KERNELS.items() if k.feature_map is not None),
                  "fourier_length": tuple(name for name, m in MIXERS.items() if m.causal)}


def decode_window(value: int | None, name: str = "window") -> int | None:
    """A sliding attention window option W in positions: 0 means the whole past (None).

    Args:
        value: None (keep what the model has), 0 (the whole past) or W > 0 positions.
        name: how the caller names the option in messages (``--window``, ``attention_window``).

    Returns:
        None for 0 (and for None), else W.

    Raises:
        ValueError: naming ``name`` and the value, unless it is None or an int ≥ 0 (bools refused).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be 0 (the whole past) or a positive number of positions, got {value!r}")
    return value or None


def check_options_apply(model: Mapping | Sequence[Mapping], given: Mapping[str, str]) -> None:
    """Refuses an option given explicitly that the model's positional encoding or kernel does not
    read (``--spe-time learned`` with RoPE would train index time and record ``learned``).

    Which encodings read an option is what their specs declare
    (:func:`spe.encodings.registry.encodings_reading`); which kernels, :data:`KERNEL_OPTIONS`.
    Options no encoding and no kernel claims (sizes, ``decay``, ``positional`` itself) always apply.

    Args:
        model: the model options as they will be built (``positional`` and ``attention``;
            missing: :class:`ModelConfig`'s defaults), or several models that share the options
            (``spe demo``'s encodings): then an option one of them reads is accepted. Only options
            the user gave go in ``given``: a default or a preset's value is not checked.
        given: option name -> how the user gave it (``--spe-time learned``).

    Raises:
        ValueError: naming how the option was given, the chosen encodings or kernels and those
            that read the option.
    """
    models = [model] if isinstance(model, Mapping) else list(model)
    defaults = {f.name: f.default for f in fields(ModelConfig) if f.name in ("positional", "attention")}
    chosen = {what: tuple(dict.fromkeys(m.get(what, defaults[what]) for m in models)) for what in defaults}
    for name, how in given.items():
        for what, readers, kind in (("positional", encodings_reading(name), "encodings"),
                                    ("attention", KERNEL_OPTIONS.get(name, ()), "kernels")):
            if readers and not set(chosen[what]) & set(readers):
                names = ", ".join(map(repr, chosen[what]))
                verb = f"{what} {names} does" if len(chosen[what]) == 1 else f"{what}s {names} do"
                mixer = " (a Fourier mixer: no queries or keys)" if set(chosen[what]) & set(MIXERS) else ""
                raise ValueError(f"{how}: {verb} not read {name}{mixer}, an option of {', '.join(readers)} only; "
                                 f"leave it out or choose one of those {kind}")


@dataclass
class ModelConfig(TrunkConfig):
    """Decoder-only language model configuration (:class:`~spe.models.DecoderLM`).

    Every option of :class:`~spe.models.TrunkConfig` (sizes, ``positional``, ``attention``,
    SPE options …), and:

    Attributes:
        tie_embeddings: share the token embedding with the output layer.
        max_distance: k, the clipping distance of ``shaw`` and ``music-relative``: relative
            positions |j − i| ≤ k have their own embedding, farther ones share the last.
        attention_window: W, causal sliding-window attention: each position attends to the
            last W positions only (itself included); None: the whole past. Set to the
            training length, it changes nothing inside the trained range and keeps every
            query/key lag a relative encoding sees beyond it within the trained lags
            (docs/ablation.md); can be changed at test time
            (:meth:`~spe.DecoderLM.set_attention_window`). 0 means None (config files have
            no null). Not with score encodings.
        fourier_length: N, the DFT length of ``attention = "fnet-causal"`` (required there,
            None otherwise; ``spe train`` sets the training length): position m reads frequency
            m mod N of its prefix (:func:`spe.ops.fourier.fourier_mixing`).

    Raises:
        ValueError: as :class:`~spe.models.TrunkConfig`; for ``convspe-2d`` (it needs an
            image grid, which a language model has not), a ``max_distance`` that is not a
            positive integer, or a bad ``attention_window`` (not a positive integer, or with
            a score encoding, or with ``attention_blocks``).
    """

    causal: ClassVar[bool] = True

    tie_embeddings: bool = True
    attention_window: int | None = None
    fourier_length: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if POSITIONAL_SPECS[self.positional].needs_grid:
            raise ValueError(f"positional {self.positional!r} encodes positions on a 2-D grid: use it with the "
                             "encoder classifier on images (spe.models.ClassifierConfig with a grid)")
        self.attention_window = decode_window(self.attention_window, "attention_window")  # TOML has no null
        if self.fourier_length is not None and self.attention not in MIXERS:
            raise ValueError(f"fourier_length is the DFT length of 'fnet-causal'; attention {self.attention!r} "
                             f"does not read it: leave it out")
        if self.attention_window is not None and POSITIONALS[self.positional] == "scores":
            raise ValueError(f"attention_window cannot be combined with positional {self.positional!r}, "
                             "which forms its own attention scores")
        self._check_blocks(self.attention_window)

    def to_dict(self) -> dict:
        """As :meth:`TrunkConfig.to_dict`; ``fourier_length`` left out when None (headers of
        models without a Fourier mixer stay as they were)."""
        values = super().to_dict()
        if values.get("fourier_length") is None:
            values.pop("fourier_length", None)
        return values

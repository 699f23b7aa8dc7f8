"""The model-level positional modules the trunk (:class:`~spe.models.Trunk`) builds from the registry.

A token encoding (``ape``, ``ape-learned``) is added to the embeddings once per model; an
SPE code generator (``sinespe``, ``convspe``, ``convspe-2d``), or the SPE module of an
oracle (``sinespe-exact``, ``convspe-exact``), is built once per model, or once per layer when
``config.share_across_layers`` is False. Per-layer modules (filters,
rotations, score terms) are built by :class:`~spe.models.block.Block`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from spe.encodings.registry import PositionalSpec

__all__ = ["PositionalModules", "positional_modules"]


@dataclass
class PositionalModules:
    """Attributes:
        embed_scale: factor of the token embeddings, which start at std 0.02 (good tied
            output logits): √C with sinusoidal APE brings them to the scale of the
            unit-amplitude encoding they are added to (Vaswani et al.); 1 otherwise, as
            there is nothing to balance (on the Bach demo the unscaled embedding trained
            SPE models better: validation 1.13 vs 1.28 nats at ~300 steps).
        ape: the token encoding ``x + pe(positions)``, or None.
        encoding: the SPE code generator (or oracle's SPE module) of the first layer (the only
            one when shared), or None.
        layer_encodings: the code generators of layers 1 … N − 1 when not shared, else None.
    """

    embed_scale: float
    ape: nn.Module | None
    encoding: nn.Module | None
    layer_encodings: nn.ModuleList | None


def positional_modules(config, spec: PositionalSpec) -> PositionalModules:
    """Builds the model-level modules of ``spec`` for ``config`` (a :class:`~spe.models.TrunkConfig`)."""
    # A score encoding's model module is the SPE module its layers read exactly (sinespe-exact).
    encoding = spec.build_model_module(config) if spec.stochastic or spec.acts_on == "scores" else None
    layer_encodings = None
    if encoding is not None and not config.share_across_layers:
        layer_encodings = nn.ModuleList(spec.build_model_module(config) for _ in range(config.num_layers - 1))
    return PositionalModules(
        embed_scale=config.d_model ** 0.5 if spec.scale_embeddings else 1.0,
        ape=spec.build_model_module(config) if spec.acts_on == "tokens" else None,
        encoding=encoding, layer_encodings=layer_encodings)

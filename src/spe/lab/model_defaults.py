"""The model defaults that depend on other options, for every task's config (music, synth): one
place, so that the same options build the same model whichever command trains it."""

from __future__ import annotations

import logging
from dataclasses import fields

from spe.attention.fourier import MIXERS
from spe.encodings.registry import POSITIONAL_SPECS, encodings_reading
from spe.lab.experiment import defaults_quiet
from spe.models.config import ModelConfig

__all__ = ["resolve_model_options"]

log = logging.getLogger(__name__)
_DEFAULT_POSITIONAL = next(f.default for f in fields(ModelConfig) if f.name == "positional")


def resolve_model_options(model: dict, seq_len: int) -> dict:
    """Model options with the defaults that depend on the encoding and the training length filled in.

    * An encoding that acts on attention scores (``shaw``, ``music-relative`` …)
      gets softmax attention unless ``attention`` is given (then a kernel that cannot form
      scores still fails with a clear error).
    * An encoding windowed by default (the registry's ``windowed_by_default``: ``sinespe``,
      ``convspe``) gets ``attention_window = seq_len`` unless ``attention_window`` is given
      (0: the whole past). A window of the training length changes nothing inside the
      trained range and keeps SPE's lags within the trained ones beyond it: on the Bach
      chorales it cut the growth of cross-entropy from [0,256) to [512,768) from +17 % to
      +8 % (docs/ablation.md); not with ``attention_blocks`` (block-local attention has its own reach).
    * With ``attention_blocks`` N, an encoding with a distance table (``shaw``, ``music-relative``)
      whose ``max_distance`` is not given gets 2N − 1 if its default is smaller (the distances a
      block and its previous one show); one given smaller clips them, which a log line says.
    * A Fourier mixer (``fnet-causal``) gets ``positional = "ape"`` unless one is given and
      ``fourier_length = seq_len`` (its DFT length N) unless given.

    Args:
        model: :class:`~spe.ModelConfig` options (not modified).
        seq_len: training length L in tokens.

    Returns:
        A new dict; an unknown encoding is left for :class:`~spe.ModelConfig` to reject.
    """
    model = _mixer_defaults(dict(model), seq_len)
    positional = model.get("positional", _DEFAULT_POSITIONAL)
    spec = POSITIONAL_SPECS.get(positional) if isinstance(positional, str) else None
    if spec is None:
        return model
    if spec.acts_on == "scores" and "attention" not in model:
        if not defaults_quiet():
            log.info("positional %s acts on attention scores: using softmax attention", positional)
        model["attention"] = "softmax"
    blocks = model.get("attention_blocks")
    if spec.windowed_by_default and "attention_window" not in model and not blocks:
        model["attention_window"] = seq_len
        if not defaults_quiet():
            log.info("%s: sliding attention window of %d positions (the training length; attention_window 0 "
                     "or --attention-window 0 for the whole past)", positional, seq_len)
    if blocks and isinstance(blocks, int) and positional in encodings_reading("max_distance"):
        _block_distances(model, positional, blocks)
    return model


def _block_distances(model: dict, positional: str, blocks: int) -> None:
    """Block-local attention of N positions shows relative distances up to 2N − 1: a distance
    table (``max_distance``) left at a smaller default grows to 2N − 1; one given smaller is kept
    and the distances it clips are logged."""
    reach = 2 * blocks - 1
    default = next(f.default for f in fields(ModelConfig) if f.name == "max_distance")
    given = model.get("max_distance")
    if given is None and default < reach:
        model["max_distance"] = reach
        if not defaults_quiet():
            log.info("%s with attention_blocks %d: max_distance %d (relative distances up to 2N - 1 = %d; the "
                     "default %d would clip them)", positional, blocks, reach, reach, default)
    elif isinstance(given, int) and given < reach and not defaults_quiet():
        log.info("%s with attention_blocks %d: relative distances %d to %d share the embedding of max_distance %d",
                 positional, blocks, given + 1, reach, given)


def _mixer_defaults(model: dict, seq_len: int) -> dict:
    """A Fourier mixer's defaults (``attention`` in :data:`spe.attention.fourier.MIXERS`): its own
    positional encoding (``ape``, FNet's) unless one is given, and for ``fnet-causal`` the DFT
    length N = ``seq_len`` unless ``fourier_length`` is given (recorded in the checkpoint's config)."""
    mixer = MIXERS.get(model.get("attention")) if isinstance(model.get("attention"), str) else None
    if mixer is None:
        return model
    if "positional" not in model:
        model["positional"] = mixer.default_positional
        if not defaults_quiet():
            log.info("attention %s mixes tokens by a Fourier transform: positional %s (no queries or keys)",
                     mixer.name, mixer.default_positional)
    if mixer.causal and "fourier_length" not in model:
        model["fourier_length"] = seq_len
        if not defaults_quiet():
            log.info("%s: DFT length N = %d (the training length; fourier_length to change it)", mixer.name, seq_len)
    return model

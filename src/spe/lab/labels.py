"""The one name of a run's model, built from its config: every table, legend, summary, report row
and progress line prints it.

:func:`run_label` names what makes two runs different models: the positional encoding, the
attention kernel, SPE's gate, the decay or forget gate, the clock the encoding reads, FoX-Pro's
parts, the short convolution, the sliding window and a Fourier mixer's DFT length. Options left
at their defaults are left out, so an old run keeps its old name (``sinespe/performer``,
``sinespe/performer window 256``).
"""

from __future__ import annotations

from collections.abc import Mapping

from spe.encodings.registry import POSITIONAL_SPECS

__all__ = ["run_label"]

# FoX-Pro's parts (spe.attention.pro), in the order the label lists them.
_PRO_PARTS = ("output_gate", "qk_norm", "kv_shift", "output_norm")


def run_label(config) -> str:
    """A model's name from its config: ``positional/attention`` then the options that differ
    from their defaults.

    Args:
        config: a :class:`~spe.models.ModelConfig` or its dict (a checkpoint header's
            ``config``, a ``report.json`` model's); fields it lacks (configs written before an
            option existed) read as that option's default.

    Returns:
        e.g. ``sinespe/performer``, ``sinespe/performer gated decay fixed window 256``,
        ``sinespe/linear decay gated-channel learned time``, ``rope/softmax learned time``,
        ``sinespe/performer onset time``, ``music-relative/softmax blocks 64`` (block-local
        attention), ``ape/fnet-causal dft 256`` (the causal Fourier mixer's DFT length). The
        clock is named only for the encoding that reads it (``spe_time``: sineSPE,
        ``rope_time``: RoPE); ``gated`` only for SPE (its gate on the code, not a forget gate,
        which is ``decay gated``).
    """
    def get(name: str, default=None):
        return config.get(name, default) if isinstance(config, Mapping) else getattr(config, name, default)

    positional = get("positional", "sinespe")
    parts = [f"{positional}/{get('attention', 'performer')}"]
    spec = POSITIONAL_SPECS.get(positional)
    if spec is not None and spec.stochastic and get("gated", False):
        parts.append("gated")
    if get("decay", "none") not in (None, "none"):
        parts.append(f"decay {get('decay')}")
    clock = {"sinespe": get("spe_time", "index"), "rope": get("rope_time", "index")}.get(positional, "index")
    if clock not in (None, "index"):
        parts.append(f"{clock} time")
    pro = [part.replace("_", "-") for part in _PRO_PARTS if get(part, False)]
    if pro:
        parts.append("+".join(pro))
    if get("short_conv", 0):
        parts.append(f"short-conv {get('short_conv')}")
    if get("attention_window") not in (None, 0):
        parts.append(f"window {get('attention_window')}")
    if get("attention_blocks", 0):
        parts.append(f"blocks {get('attention_blocks')}")
    if get("fourier_length"):  # fnet-causal's DFT length N
        parts.append(f"dft {get('fourier_length')}")
    return " ".join(parts)

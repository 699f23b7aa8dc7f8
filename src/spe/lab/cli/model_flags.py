"""The decoder LM's flags, declared once for every command that trains one (``spe train``, ``spe demo``,
``spe synth``): :func:`add_model_flags` declares them, :func:`model_flag_options` reads them."""

from __future__ import annotations

import argparse

__all__ = ["add_blocks_flag", "add_model_flags", "blocks_flag_option", "check_model_flags_apply",
           "model_flag_options"]

_MODEL_FLAGS = ("positional", "attention", "d_model", "num_layers", "num_heads", "decay", "short_conv")


def model_flag_options(args: argparse.Namespace) -> dict:
    """The model options given by the flags of :func:`add_model_flags` (those given) and every
    ``--model-option KEY=VALUE``, as one dict (``spe train``, ``spe demo``, ``spe synth``)."""
    from spe.encodings.registry import encoding_flags
    from spe.lab.experiment import model_options
    from spe.models.config import decode_window

    flags = {flag: getattr(args, flag) for flag in (*_MODEL_FLAGS, *(name for name, _ in encoding_flags()))
             if getattr(args, flag, None) is not None}
    if getattr(args, "attention_window", None) is not None:
        flags["attention_window"] = decode_window(args.attention_window, "--attention-window")
    flags.update(blocks_flag_option(args))
    if getattr(args, "ungated", False) or getattr(args, "gated", False):
        flags["gated"] = bool(args.gated)
    return model_options(getattr(args, "model_option", None) or [], flags=flags)


def check_model_flags_apply(args: argparse.Namespace, model: dict | list[dict]) -> None:
    """Refuses a model flag or ``--model-option`` that ``model``'s encoding or kernel (the options as
    they will be built; several models: all of them) does not read
    (:func:`spe.models.config.check_options_apply`)."""
    from spe.models.config import check_options_apply

    given = {key: ("--gated" if value else "--ungated") if key == "gated" and (args.gated or args.ungated)
             else f"--{key.replace('_', '-')} {value}" if getattr(args, key, None) is not None
             else f"--model-option {key}={value!r}" for key, value in model_flag_options(args).items()}
    check_options_apply(model, given)


def add_blocks_flag(p: argparse.ArgumentParser) -> None:
    """``--attention-blocks N`` (the model option ``attention_blocks``), declared once for every command
    that trains a model (``spe train``, ``spe demo``, ``spe synth``, ``spe lra``);
    :func:`blocks_flag_option` reads it."""
    p.add_argument("--attention-blocks", type=int, metavar="N",
                   help="block-local softmax attention (the Music Transformer's): blocks of N positions, each "
                   "attending to itself (causally) and to the previous block; memory O(L*N), decoding keeps 2N "
                   "keys (default 0: off; not with --attention-window)")


def blocks_flag_option(args: argparse.Namespace) -> dict:
    """``{"attention_blocks": N}`` when ``--attention-blocks`` was given, else {}.

    Raises:
        ValueError: naming the flag, unless N is 0 or a positive int.
    """
    value = getattr(args, "attention_blocks", None)
    if value is None:
        return {}
    if value < 0:
        raise ValueError(f"--attention-blocks must be 0 (off) or a positive number of positions, got {value}")
    return {"attention_blocks": value}


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """The model's flags (positional encoding, attention, decay, gating, window, each encoding's
    options, short convolution, ``--model-option``, sizes), declared once for every command that
    trains a decoder LM (``spe train``, ``spe demo``, ``spe synth``); :func:`model_flag_options` reads them."""
    from spe.lab.cli.names import flag_choices

    names = flag_choices()
    p.add_argument("--positional", help=names["positional"] + " (score encodings select softmax unless "
                   "--attention is given)")
    p.add_argument("--attention", help=", ".join(names["attention"]))
    p.add_argument("--decay", choices=names["decay"],
                   help="fixed (RetNet's γ_h = 1 − 2^(−5−h)), learned from there, gated (a forget gate per "
                   "head from the input; softmax: FoX) or gated-channel (GLA's, per channel); default none")
    gate = p.add_mutually_exclusive_group()
    gate.add_argument("--gated", action="store_true", help="SPE with gating (eq. 23-25)")
    gate.add_argument("--ungated", action="store_true", help="SPE without gating (the default)")
    p.add_argument("--attention-window", type=int,
                   help="sliding attention window W in positions, kept at test time (0: the whole past; "
                   "default: the training length for sinespe and convspe, the whole past otherwise)")
    add_blocks_flag(p)
    for name, keywords in names["encoding_flags"]:  # each encoding's options, declared in its file
        p.add_argument("--" + name.replace("_", "-"), **keywords)
    p.add_argument("--short-conv", type=int, metavar="K", help="width of a causal depthwise convolution on "
                   "queries, keys and values (fla's ShortConvolution, 4 there; default 0: none)")
    p.add_argument("--model-option", action="append", metavar="KEY=VALUE",
                   help="any model option (a ModelConfig field; repeatable), e.g. rope_base=500000 or "
                   "code_noise=orthogonal; VALUE read as TOML (true, 64, 1e-3), else as text")
    p.add_argument("--d-model", type=int, help="model width (default: the config's [model] d_model)")
    p.add_argument("--num-layers", type=int, help="blocks (default: the config's)")
    p.add_argument("--num-heads", type=int, help="attention heads (default: the config's)")

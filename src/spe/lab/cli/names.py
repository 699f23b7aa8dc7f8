"""The flags that every command shares, derived from their one declaration (never copied in the
parsers): the choice lists (read from the registries), the run options' flags
(:class:`spe.lab.options.RunOptions`), the engine options' (:class:`spe.lab.options.ExperimentOptions`),
the training length's ``--seq-len``, an old name kept as an alias, defaults said as resolved.
tests/lab/cli/test_declared_once.py walks every command's flags and fails on one declared by hand."""

from __future__ import annotations

import argparse

__all__ = ["add_aliased", "add_option_flag", "add_run_flag", "add_seq_len_flag", "flag_choices", "say_defaults"]


def flag_choices() -> dict:
    """The choice lists of the flags, read from the registries (never copied here)."""
    from spe.attention.fourier import MIXERS
    from spe.attention.layer import ATTENTIONS, DECAY_FORM
    from spe.encodings.registry import encoding_flags, positional_help
    from spe.lab.lra.data.listops import PIPELINES
    from spe.lab.lra.data.tasks import TASKS
    from spe.lab.engine.precision import PRECISIONS

    return {"positional": positional_help(), "attention": (*ATTENTIONS, *MIXERS), "decay": ("none", *DECAY_FORM),
            "encoding_flags": encoding_flags(), "precision": tuple(PRECISIONS), "pipelines": PIPELINES, "tasks": TASKS}


def add_aliased(p: argparse.ArgumentParser, name: str, old: str | None, **keywords) -> argparse.Action:
    """A flag under its one name ``name``, and ``old`` (None: none) kept as an alias whose help
    says the new name (same destination; the alias sets no default of its own)."""
    dest = keywords.setdefault("dest", name.lstrip("-").replace("-", "_"))
    metavar = keywords.setdefault("metavar", dest.upper())
    action = p.add_argument(name, **keywords)
    if old:
        p.add_argument(old, dest=dest, type=keywords.get("type"), metavar=metavar, default=argparse.SUPPRESS,
                       help=f"old name of {name} (an alias)")
    return action


def add_seq_len_flag(p: argparse.ArgumentParser, *, old: str | None = None, note: str = "") -> argparse.Action:
    """``--seq-len L``, the training length of every task (``seq_len`` in TrainConfig, LRAConfig and
    SynthConfig), declared once; ``old``: this command's old name of it, kept as an alias
    (``--max-length`` of ``spe lra``, ``--train-length`` of ``spe synth``); ``note``: what a
    token is here."""
    action = add_aliased(p, "--seq-len", old, type=int, metavar="L",
                         help="training length L in tokens" + (f"; {note}" if note else ""))
    action.declared = ("seq_len", "seq_len")
    return action


def say_defaults(p: argparse.ArgumentParser, values: dict, source: str) -> None:
    """Appends ``(default V, SOURCE)`` to the help of each flag of ``p`` whose destination
    ``values`` resolves and whose help does not say its default yet (aliases left as they are)."""
    for a in p._actions:
        if a.dest in values and a.default is not argparse.SUPPRESS and "(default" not in (a.help or ""):
            a.help = f"{a.help} (default {values[a.dest]}, {source})"


def add_option_flag(p: argparse.ArgumentParser, name: str, *, note: str = "", default=None,
                    **keywords) -> argparse.Action:
    """The flag of the training option ``name``, derived from its one declaration
    (:func:`spe.lab.options.option_flag`: its help, then this command's ``note`` where its runs
    differ, e.g. ``spe lra``'s per-seed folders, and its ``default``); ``keywords``: argparse's
    own (``choices``). The action records its declaration (``declared``), which
    tests/lab/cli/test_declared_once.py checks."""
    from spe.lab.options import option_flag

    return _declared(p, "ExperimentOptions", name, option_flag(name, note=note, default=default), keywords)


def add_run_flag(p: argparse.ArgumentParser, name: str, *, note: str = "", default=None,
                 **keywords) -> argparse.Action:
    """The flag of the run option ``name`` (``seed``, ``threads``, ``device``, ``precision``,
    ``out``) of a command, derived from its one declaration (:class:`spe.lab.options.RunOptions`,
    :func:`spe.lab.options.run_flag`); ``note``: what this command adds (what ``--out`` holds);
    ``default``: this command's; ``keywords``: argparse's own (``required``). Its rule is checked before any work
    (:func:`spe.lab.options.check_flags` from :func:`spe.lab.cli.main.main`)."""
    from spe.lab.options import run_flag

    if name == "precision":
        keywords["choices"] = flag_choices()["precision"]
    return _declared(p, "RunOptions", name, run_flag(name, note=note, default=default), keywords)


def _declared(p: argparse.ArgumentParser, record: str, name: str, derived: tuple[str, dict],
              keywords: dict) -> argparse.Action:
    flag, derived_keywords = derived
    action = p.add_argument(flag, **{**derived_keywords, **keywords})
    action.declared = (record, name)
    return action

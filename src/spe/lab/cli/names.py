"""The choice lists of the command's flags, read from the registries (never copied in the parsers)."""

from __future__ import annotations

__all__ = ["flag_choices"]


def flag_choices() -> dict:
    """The choice lists of the flags, read from the registries (never copied here)."""
    from spe.attention.layer import ATTENTIONS, DECAY_FORM
    from spe.encodings.registry import encoding_flags, positional_help
    from spe.lab.data.listops import PIPELINES
    from spe.lab.data.lra.tasks import TASKS
    from spe.lab.train.precision import PRECISIONS

    return {"positional": positional_help(), "attention": ATTENTIONS, "decay": ("none", *DECAY_FORM),
            "encoding_flags": encoding_flags(), "precision": tuple(PRECISIONS), "pipelines": PIPELINES, "tasks": TASKS}

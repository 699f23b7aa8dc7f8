"""The training tasks of :mod:`spe.train.engine` that live with training (the music language model)."""

from spe.train.tasks.lm import LMTask

__all__ = ["LMTask"]

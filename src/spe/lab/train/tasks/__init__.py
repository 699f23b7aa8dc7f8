"""The training tasks of :mod:`spe.lab.train.engine` that live with training (the music language model)."""

from spe.lab.train.tasks.lm import LMTask

__all__ = ["LMTask"]

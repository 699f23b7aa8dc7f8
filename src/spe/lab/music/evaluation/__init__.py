"""Evaluation of trained models: extrapolation beyond the training length, checkpoints, the report.

* :mod:`~spe.lab.music.evaluation.extrapolation`: per-position cross-entropy, unigram baseline, bucket means.
* :mod:`~spe.lab.music.evaluation.checkpoints`: loaded checkpoints on the validation split -> summary,
  CSV, PNG, JSON (``spe evaluate``).
* :mod:`~spe.lab.music.evaluation.report` (+ ``report_markdown``, ``music_prompt``, ``audio``,
  ``r_grid``, ``publish``, ``pictures``): ``spe report`` (needs the ``music`` extra).
"""

from spe.lab.music.evaluation.checkpoints import evaluate_checkpoints, evaluate_models, model_label, write_evaluation
from spe.lab.music.evaluation.extrapolation import bucket_means, per_position_cross_entropy, unigram_cross_entropy
from spe.lab.music.evaluation.r_grid import r_grids

__all__ = ["bucket_means", "evaluate_checkpoints", "evaluate_models", "model_label", "per_position_cross_entropy",
           "r_grids", "unigram_cross_entropy", "write_evaluation"]

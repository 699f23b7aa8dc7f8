"""Evaluation of trained models: extrapolation beyond the training length, checkpoints, the report.

* :mod:`~spe.evaluation.extrapolation`: per-position cross-entropy, unigram baseline, bucket means.
* :mod:`~spe.evaluation.checkpoints`: loaded checkpoints on the validation split -> summary,
  CSV, PNG, JSON (``spe evaluate``).
* :mod:`~spe.evaluation.report` (+ ``report_markdown``, ``music_prompt``, ``audio``,
  ``r_grid``, ``publish``, ``pictures``): ``spe report`` (needs the ``music`` extra).
"""

from spe.evaluation.checkpoints import evaluate_checkpoints, evaluate_models, model_label, write_evaluation
from spe.evaluation.extrapolation import bucket_means, per_position_cross_entropy, unigram_cross_entropy
from spe.evaluation.r_grid import r_grids

__all__ = ["bucket_means", "evaluate_checkpoints", "evaluate_models", "model_label", "per_position_cross_entropy",
           "r_grids", "unigram_cross_entropy", "write_evaluation"]

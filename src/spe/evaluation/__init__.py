"""Evaluation: extrapolation beyond the training length."""

from spe.evaluation.extrapolation import bucket_means, per_position_cross_entropy, unigram_cross_entropy

__all__ = ["bucket_means", "per_position_cross_entropy", "unigram_cross_entropy"]

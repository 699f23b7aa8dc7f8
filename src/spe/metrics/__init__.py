"""Evaluation metrics of Liutkus et al. (2021) beyond the loss.

* Positional-encoding properties (appendix D.3, Table 7): :func:`translation_invariance` and
  :func:`monotonicity` of an unnormalised attention matrix, probed with
  :func:`identical_token_attention` (torch only).
* Musical style similarity (appendix C.2, Figure 5): :func:`onset_duration_profile`,
  :func:`time_pitch_profile`, :func:`style_similarity` and :func:`split_equal_parts`
  (the ``music`` extra: numpy, symusic).
"""

from spe.metrics.pe_properties import monotonicity, translation_invariance
from spe.metrics.probing import identical_token_attention
from spe.metrics.style import onset_duration_profile, split_equal_parts, style_similarity, time_pitch_profile

__all__ = [
    "identical_token_attention",
    "monotonicity",
    "onset_duration_profile",
    "split_equal_parts",
    "style_similarity",
    "time_pitch_profile",
    "translation_invariance",
]

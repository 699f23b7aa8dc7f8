"""Evaluation metrics of Liutkus et al. (2021) beyond the loss.

* Positional-encoding properties (appendix D.3, Table 7): :func:`translation_invariance` and
  :func:`monotonicity` of an unnormalised attention matrix, probed with
  :func:`identical_token_attention` (torch only); Table 7's protocol (which positions,
  offsets and tokens, best head) is :func:`pe_metrics` with :func:`probe_plan` and
  :func:`probe_tokens` (numpy).
* Musical style similarity (appendix C.2, Figure 5): :func:`onset_duration_profile`,
  :func:`time_pitch_profile`, :func:`style_similarity` and :func:`split_equal_parts`
  (the ``music`` extra: numpy, symusic).
* Offline attention (appendix D.1, Figures 8-12): :func:`layer_queries_keys` and
  :func:`attention_matrices` (torch only).
"""

from spe.lab.metrics.capture import attention_matrices, layer_queries_keys
from spe.lab.metrics.pe_probe import pe_metrics, probe_plan, probe_tokens
from spe.lab.metrics.pe_properties import monotonicity, translation_invariance
from spe.lab.metrics.probing import identical_token_attention
from spe.lab.metrics.style import onset_duration_profile, split_equal_parts, style_similarity, time_pitch_profile

__all__ = [
    "attention_matrices",
    "identical_token_attention",
    "layer_queries_keys",
    "monotonicity",
    "onset_duration_profile",
    "pe_metrics",
    "probe_plan",
    "probe_tokens",
    "split_equal_parts",
    "style_similarity",
    "time_pitch_profile",
    "translation_invariance",
]

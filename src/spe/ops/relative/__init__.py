"""Softmax attention with a relative-position term in the scores, one mechanism: Music
Transformer's skewing and Shaw et al.'s explicit embeddings.

Layout after fla's ``ops/<mechanism>``: :mod:`~spe.ops.relative.parallel` (the skewing reshape,
Music Transformer's O(L·D) form and Shaw's explicit one), :mod:`~spe.ops.relative.naive` (Music
Transformer's explicit twin, also its decoding step), :mod:`~spe.ops.relative.checks`.
"""

from spe.ops.relative.naive import music_relative_attention_reference
from spe.ops.relative.parallel import music_relative_attention, relative_shift, shaw_attention, skew

__all__ = ["music_relative_attention", "music_relative_attention_reference", "relative_shift", "shaw_attention",
           "skew"]

"""Chunked sums shared by the mechanisms (fla's ``ops/common``): the causal sums of linear
attention, plain and windowed (:mod:`~spe.ops.common.chunk`), and their forms for keys with log
scales and a constant decay (:mod:`~spe.ops.common.scaled`). :mod:`spe.ops.linear_attn` and
:mod:`spe.ops.decay` run them; they read no options record, only tensors and sizes.
"""

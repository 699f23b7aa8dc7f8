"""What the mechanisms share (fla's ``ops/common`` and ``modules/feature_map``): the causal sums of
linear attention, plain and windowed (:mod:`~spe.ops.common.chunk`), and their forms for keys with
log scales and a constant decay (:mod:`~spe.ops.common.scaled`), which read no options record, only
tensors and sizes; the checks (:mod:`~spe.ops.common.checks`); the feature maps φ of the linear
kernels (:mod:`~spe.ops.common.feature_maps`) and the typed decoding states of every kernel
(:mod:`~spe.ops.common.state`).
"""

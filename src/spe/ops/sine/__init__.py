"""sineSPE's kernels, one mechanism: the sinusoidal features Ω of eq. (19) and the products that
apply a sineSPE code without storing it (Liutkus et al. 2021).

Layout after fla's ``ops/<mechanism>``: :mod:`~spe.ops.sine.phases` (2π·frac(f·n) and Ω,
accurate at large positions), :mod:`~spe.ops.sine.naive` (the reference, Ω formed whole),
:mod:`~spe.ops.sine.fused` (one GEMM of inner size D·2K per example, in blocks of positions),
:mod:`~spe.ops.sine.blocked` (each block's code formed once for the batch),
:mod:`~spe.ops.sine.recompute` (what the two blocked products share),
:mod:`~spe.ops.sine.costs` (which of them ``impl="auto"`` picks) and
:mod:`~spe.ops.sine.timed` (the code at per-sequence times of a clock, in blocks of positions).
"""

from spe.ops.sine.blocked import SharedSineProduct
from spe.ops.sine.costs import BLOCKED_EFFICIENCY, MATERIALIZE_LIMIT, choose_sine_impl, sine_costs
from spe.ops.sine.fused import FusedSineProduct
from spe.ops.sine.naive import sine_product_reference
from spe.ops.sine.phases import sine_features, sine_phase
from spe.ops.sine.timed import TimedSineProduct

__all__ = ["BLOCKED_EFFICIENCY", "MATERIALIZE_LIMIT", "FusedSineProduct", "SharedSineProduct", "TimedSineProduct",
           "choose_sine_impl", "sine_costs", "sine_features", "sine_phase", "sine_product_reference"]

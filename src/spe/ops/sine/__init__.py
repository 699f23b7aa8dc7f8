"""sineSPE's kernels, one mechanism: the sinusoidal features Ω of eq. (19), the products that
apply a sineSPE code without storing it, the filter's application to queries and keys with
gating (eq. 16-17, 23-25) and a learned clock's times (Liutkus et al. 2021).

Layout after fla's ``ops/<mechanism>``: :mod:`~spe.ops.sine.phases` (2π·frac(f·n) and Ω,
accurate at large positions), :mod:`~spe.ops.sine.naive` (the float64 references: Ω formed
whole, the gated code formed, the timed code, the clock step by step),
:mod:`~spe.ops.sine.apply` (eq. 16-17 with gating, what :class:`~spe.encodings.SPEFilter` calls),
:mod:`~spe.ops.sine.clock` (τ = Σ Δ, what :class:`~spe.encodings.LearnedClock` calls),
:mod:`~spe.ops.sine.fused` (one GEMM of inner size D·2K per example, in blocks of positions),
:mod:`~spe.ops.sine.blocked` (each block's code formed once for the batch),
:mod:`~spe.ops.sine.recompute` (what the two blocked products share),
:mod:`~spe.ops.sine.costs` (which of them ``impl="auto"`` picks) and
:mod:`~spe.ops.sine.timed` (the code at per-sequence times of a clock, in blocks of positions).
"""

from spe.ops.sine.apply import (apply_code, apply_sine_code_blocked, apply_sine_code_fused,
                                apply_sine_code_timed, apply_sine_code_timed_pair)
from spe.ops.sine.blocked import SharedSineProduct
from spe.ops.sine.clock import clock_times
from spe.ops.sine.costs import BLOCKED_EFFICIENCY, MATERIALIZE_LIMIT, choose_sine_impl, sine_costs
from spe.ops.sine.fused import FusedSineProduct
from spe.ops.sine.naive import (apply_code_reference, apply_sine_code_timed_reference, clock_reference,
                                sine_product_reference)
from spe.ops.sine.phases import sine_features, sine_phase
from spe.ops.sine.timed import TimedSineProduct

__all__ = ["BLOCKED_EFFICIENCY", "MATERIALIZE_LIMIT", "FusedSineProduct", "SharedSineProduct", "TimedSineProduct",
           "apply_code", "apply_code_reference", "apply_sine_code_blocked", "apply_sine_code_fused",
           "apply_sine_code_timed", "apply_sine_code_timed_pair", "apply_sine_code_timed_reference",
           "choose_sine_impl", "clock_reference", "clock_times", "sine_costs", "sine_features", "sine_phase",
           "sine_product_reference"]

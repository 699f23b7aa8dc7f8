"""sineSPE's code applied at per-sequence times (a learned or the music's clock), in blocks of
positions, never storing the (H, B·L, K, D) features.

Letters: N = positions (batch × length, flattened), n: one block of them, H = num_heads,
D = head_dim, K = num_sines, R = num_realizations.

With a clock the code differs per sequence: for each side (queries, keys)

    y[h, m, r] = Σ_{k,d} x[h, m, d] · (cos(a[h, m, k, d]) W_c[h, k, d, r] + sin(a) W_s[h, k, d, r]),
    a = 2π f[h, d, k] τ[h, m],

the queries' phases θ folded into their W_c, W_s beforehand (cos(a + θ) = cos a cos θ −
sin a sin θ), so both sides read one set of cos and sin. :class:`TimedSineProduct` forms them
for one block of positions at a time and again in backward, so its extra memory is one block
whatever the length, and the phases, reduced modulo 1 in float64 (as
:func:`~spe.ops.sine.phases.sine_phase`), are never kept. Its slow twin is
:func:`spe.ops.sine.naive.apply_sine_code_timed_reference` (the code formed whole in float64);
tests compare them forward and backward. A block's elementwise passes are two pure functions
(``_features`` forward, ``_feature_grads`` backward), run as written or, under :data:`COMPILE`,
through ``torch.compile`` as fused loops; the matrix products stay ``bmm``.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from spe.ops.sine.costs import block_budget

__all__ = ["COMPILE", "TimedSineProduct", "compile_products", "timed_trig"]

#: ``torch.compile`` the product's elementwise passes per block (the float64 phase reduction,
#: cos and sin, x times the features, and in backward x's and the phases' gradients) into fused
#: loops, by device type. Off by default: the first call in a process compiles for some
#: seconds (dynamic shapes: once per dtype and number of sides, not per length); ``spe train
#: --compile`` turns it on with the model's compile. A compiler that fails warns once and the
#: eager twin (the same functions, uncompiled) runs.
COMPILE: dict[str, bool] = {"cpu": False, "cuda": False}

#: Blocks of fewer positions run eagerly even under :data:`COMPILE`: a decoding step's few
#: positions cost the compiled call's guards more than its fused loops save (CPU: 2.5 against
#: 2.3 ms a step).
COMPILE_MIN_POSITIONS = 64

_COMPILED: dict[str, object] = {}
_COMPILE_FAILED: list[str] = []


def compile_products(device: torch.device | str) -> None:
    """Turns :data:`COMPILE` on for ``device``'s type (what ``spe train --compile`` and ``spe bench
    --compile`` do beside compiling the model)."""
    COMPILE[torch.device(device).type] = True


def timed_trig(frequencies: Tensor, times: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin of 2π f τ, (H, n, K, D) in ``dtype``, the phases reduced as
    :func:`~spe.ops.sine.phases.sine_phase` (f·τ in float64 modulo 1: ~6e-8 cycles whatever τ).

    Args:
        frequencies: (H, D, K) f, cycles per unit of time.
        times: (H, n) τ.
    """
    return _trig(_rows_kd(frequencies), times.double(), dtype)


def _rows_kd(frequencies: Tensor) -> Tensor:
    # (H, D, K) -> (H, 1, K, D) float64: the features' (k, d) order, broadcast over positions
    return frequencies.double().transpose(1, 2).contiguous()[:, None]


def _trig(f_kd: Tensor, times: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    # f τ in float64, its fraction (in (−1, 1): the cos and sin of sine_phase's [0, 1)), then
    # 2π in the features' precision; no gradient is kept (the product forms its own)
    angle = torch.frac(f_kd * times[..., None, None]).to(_accumulate(dtype)) * (2 * math.pi)
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def _features(f_kd: Tensor, times: Tensor, xs: list[Tensor]) -> list[tuple[Tensor, Tensor]]:
    # one block's u_c = x cos a, u_s = x sin a, (H, n, K, D) each, for every side x (H, n, D)
    cos, sin = _trig(f_kd, times, xs[0].dtype)
    return [(x[:, :, None, :] * cos, x[:, :, None, :] * sin) for x in xs]


def _feature_grads(f_kd: Tensor, times: Tensor, xs: list[Tensor], grads: list[tuple[Tensor, Tensor]]):
    # one block's backward through the features, given each side's g_c = ∂L/∂u_c, g_s (H, n, K, D):
    # x's gradient Σ_k g_c cos a + g_s sin a, the features u_c, u_s again (for W's gradient),
    # and the phases' ∂L/∂a = Σ_sides g_s u_c − g_c u_s (d cos a = −sin a da, d sin a = cos a da)
    # reduced at once to τ's gradient (H, n) and f's (H, K, D): a = 2π f τ
    cos, sin = _trig(f_kd, times, xs[0].dtype)
    sides, g_angle = [], None
    for x, (g_c, g_s) in zip(xs, grads):
        u_c, u_s = x[:, :, None, :] * cos, x[:, :, None, :] * sin
        sides.append(((g_c * cos + g_s * sin).sum(2), u_c, u_s))
        term = g_s * u_c - g_c * u_s
        g_angle = term if g_angle is None else g_angle + term
    acc = _accumulate(xs[0].dtype)
    g_angle = g_angle.to(acc) * (2 * math.pi)
    g_times = (g_angle * f_kd.to(acc)).sum((2, 3))
    g_freqs = (g_angle * times.to(acc)[..., None, None]).sum(1)
    return sides, g_times, g_freqs


def _run(fn, f_kd: Tensor, times: Tensor, *rest):
    # fn(f_kd, times (H, n), *rest) for one block: compiled where COMPILE asks for it (once per
    # process) and the block is long enough, else as written
    if (COMPILE.get(times.device.type, False) and not _COMPILE_FAILED
            and times.shape[1] >= COMPILE_MIN_POSITIONS):
        try:
            compiled = _COMPILED.get(fn.__name__)
            if compiled is None:
                compiled = _COMPILED[fn.__name__] = torch.compile(fn, dynamic=True)
            return compiled(f_kd, times, *rest)
        except Exception as err:  # noqa: BLE001 - a compiler failure of any kind: the eager twin still works
            _COMPILE_FAILED.append(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            warnings.warn(f"sineSPE in learned time: torch.compile of the timed product failed "
                          f"({_COMPILE_FAILED[0]}); it runs uncompiled", RuntimeWarning, stacklevel=2)
    return fn(f_kd, times, *rest)


def _accumulate(dtype: torch.dtype) -> torch.dtype:
    # gradients and phases in float32 at least (bf16 products under autocast), float64 for float64
    return torch.promote_types(dtype, torch.float32)


def _blocks(n: int, h: int, k: int, d: int, device: torch.device):
    # a block's (H, n, K, D) features: a few MiB on a CPU, so its passes stay in cache; far more
    # on a GPU, where small blocks are launch-bound (spe.ops.sine.costs.BLOCK_ELEMENTS)
    step = max(1, block_budget("timed", device) // max(1, h * k * d))
    return ((s, min(n, s + step)) for s in range(0, n, step))


class TimedSineProduct(torch.autograd.Function):
    """(y_1, y_2) of one or two sides (module docstring) from one clock, in blocks of positions.

    ``apply(frequencies, times, x1, w1, x2, w2)``:

    * frequencies: (H, D, K); times: (H, N) (float64 keeps the phases exact at large τ);
    * x1, x2: (H, N, D), the sides' queries or keys (x2 and w2 None for one side);
    * w1, w2: (2, H, K·D, R), each side's W_c and W_s stacked, rows (k, d), in x's dtype.

    Returns (y1, y2), each (H, N, R) in x's dtype (y2 None for one side). Gradients flow to
    every tensor input; the features are formed again in backward. The elementwise passes of a
    block are pure functions, compiled into fused loops where :data:`COMPILE` asks for it.
    """

    @staticmethod
    def forward(ctx, frequencies: Tensor, times: Tensor, x1: Tensor, w1: Tensor, x2: Tensor | None,
                w2: Tensor | None):
        # contiguous (H, N, D) sides, so each block's products are (H, n, K·D) views
        x1, x2 = x1.contiguous(), (x2.contiguous() if x2 is not None else None)
        h, n, d = x1.shape
        k = frequencies.shape[-1]
        xs, ws = [x1] + ([x2] if x2 is not None else []), [w1] + ([w2] if x2 is not None else [])
        outs = [x.new_empty(h, n, w.shape[-1]) for x, w in zip(xs, ws)]
        f_kd, times64 = _rows_kd(frequencies), times.double()
        for s, e in _blocks(n, h, k, d, x1.device):
            features = _run(_features, f_kd, times64[:, s:e], [x[:, s:e] for x in xs])
            for (u_c, u_s), (w_c, w_s), out in zip(features, ws, outs):
                y = torch.bmm(u_c.view(h, e - s, k * d), w_c)
                out[:, s:e] = torch.baddbmm(y, u_s.view(h, e - s, k * d), w_s)
        ctx.save_for_backward(frequencies, times, x1, w1, x2, w2)
        return outs[0], (outs[1] if x2 is not None else None)

    @staticmethod
    def backward(ctx, grad1: Tensor | None, grad2: Tensor | None):
        frequencies, times, x1, w1, x2, w2 = ctx.saved_tensors
        needs = ctx.needs_input_grad
        h, n, d = x1.shape
        k = frequencies.shape[-1]
        # the sides with an output gradient: (x, (W_c, W_s), ∂L/∂y, the index of x among the inputs; W's is next)
        sides = [(x, w, g, i) for x, w, g, i in ((x1, w1, grad1, 2), (x2, w2, grad2, 4))
                 if x is not None and g is not None]
        grads: list[Tensor | None] = [None] * 6
        acc = _accumulate(x1.dtype)
        for x, w, _, i in sides:
            if needs[i]:
                grads[i] = torch.empty_like(x)
            if needs[i + 1]:
                grads[i + 1] = torch.zeros(w.shape, dtype=acc, device=w.device)
        gf = torch.zeros(h, k, d, dtype=acc, device=x1.device) if needs[0] else None
        gt = torch.zeros(h, n, dtype=acc, device=x1.device) if needs[1] else None
        f_kd, times64 = _rows_kd(frequencies), times.double()
        for s, e in _blocks(n, h, k, d, x1.device) if sides else ():
            l = e - s
            gbs, g_us = [], []  # each side's ∂L/∂y (H, n, R) and ∂L/∂u_c, ∂L/∂u_s (H, n, K, D)
            for x, (w_c, w_s), g, _ in sides:
                gb = g[:, s:e].to(x.dtype)
                gbs.append(gb)
                g_us.append((torch.bmm(gb, w_c.transpose(1, 2)).view(h, l, k, d),
                             torch.bmm(gb, w_s.transpose(1, 2)).view(h, l, k, d)))
            per_side, g_times, g_freqs = _run(_feature_grads, f_kd, times64[:, s:e],
                                              [x[:, s:e] for x, _, _, _ in sides], g_us)
            for (gx, u_c, u_s), gb, (_, _, _, i) in zip(per_side, gbs, sides):
                if grads[i] is not None:
                    grads[i][:, s:e] = gx
                if grads[i + 1] is not None:
                    grads[i + 1][0] += torch.bmm(u_c.view(h, l, k * d).transpose(1, 2), gb).to(acc)
                    grads[i + 1][1] += torch.bmm(u_s.view(h, l, k * d).transpose(1, 2), gb).to(acc)
            if gt is not None:
                gt[:, s:e] = g_times
            if gf is not None:
                gf += g_freqs
        if gf is not None:
            grads[0] = gf.transpose(1, 2).to(frequencies.dtype)
        if gt is not None:
            grads[1] = gt.to(times.dtype)
        for i, w in ((3, w1), (5, w2)):
            if grads[i] is not None:
                grads[i] = grads[i].to(w.dtype)
        return tuple(grads)

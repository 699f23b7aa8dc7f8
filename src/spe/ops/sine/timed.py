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
:func:`spe.encodings.sine.apply_sine_code_timed_reference` (the code formed whole in float64);
tests compare them forward and backward.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spe.ops.sine.costs import block_budget

__all__ = ["TimedSineProduct", "timed_trig"]


def timed_trig(frequencies: Tensor, times: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin of 2π f τ, (H, n, K, D) in ``dtype``, the phases reduced as
    :func:`~spe.ops.sine.phases.sine_phase` (f·τ in float64 modulo 1: ~6e-8 cycles whatever τ).

    Args:
        frequencies: (H, D, K) f, cycles per unit of time.
        times: (H, n) τ.
    """
    # one float64 product and one in-place frac (a fraction in (−1, 1): the cos and sin of
    # sine_phase's [0, 1)), then 2π in the features' precision: sine_phase's floor, subtraction
    # and float64 2π keep a gradient this product forms itself
    cycles = frequencies.double().transpose(1, 2).contiguous()[:, None] * times.double()[..., None, None]
    angle = cycles.frac_().to(_accumulate(dtype)).mul_(2 * math.pi)  # (H, n, K, D)
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


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
    every tensor input; the features are formed again in backward.
    """

    @staticmethod
    def forward(ctx, frequencies: Tensor, times: Tensor, x1: Tensor, w1: Tensor, x2: Tensor | None,
                w2: Tensor | None):
        # contiguous (H, N, D) sides, so each block's products are (H, n, K·D) views
        x1, x2 = x1.contiguous(), (x2.contiguous() if x2 is not None else None)
        h, n, d = x1.shape
        k = frequencies.shape[-1]
        sides = [(x1, *w1)] + ([(x2, *w2)] if x2 is not None else [])
        outs = [x.new_empty(h, n, w_c.shape[-1]) for x, w_c, _ in sides]
        for s, e in _blocks(n, h, k, d, x1.device):
            cos, sin = timed_trig(frequencies, times[:, s:e], x1.dtype)
            for (x, w_c, w_s), out in zip(sides, outs):
                xb = x[:, s:e, None, :]  # (H, n, 1, D)
                y = torch.bmm((xb * cos).view(h, e - s, k * d), w_c)
                out[:, s:e] = torch.baddbmm(y, (xb * sin).view(h, e - s, k * d), w_s)
        ctx.save_for_backward(frequencies, times, x1, w1, x2, w2)
        return outs[0], (outs[1] if x2 is not None else None)

    @staticmethod
    def backward(ctx, grad1: Tensor | None, grad2: Tensor | None):
        frequencies, times, x1, w1, x2, w2 = ctx.saved_tensors
        needs = ctx.needs_input_grad
        h, n, d = x1.shape
        k = frequencies.shape[-1]
        # (x, W_c, W_s, its output's gradient, the index of x among the inputs; W's is next)
        sides = [(x1, *w1, grad1, 2)] + ([(x2, *w2, grad2, 4)] if x2 is not None else [])
        grads: list[Tensor | None] = [None] * 6
        acc = _accumulate(x1.dtype)
        for x, w_c, _, g, i in sides:
            if g is None:
                continue
            if needs[i]:
                grads[i] = torch.empty_like(x)
            if needs[i + 1]:
                grads[i + 1] = torch.zeros((2, *w_c.shape), dtype=acc, device=w_c.device)
        want_angle = needs[0] or needs[1]
        gf = torch.zeros(h, k * d, dtype=acc, device=x1.device) if needs[0] else None
        gt = torch.empty(h, n, dtype=acc, device=x1.device) if needs[1] else None
        f_kd = frequencies.to(acc).transpose(1, 2).reshape(h, k * d, 1) if gt is not None else None
        for s, e in _blocks(n, h, k, d, x1.device):
            l = e - s
            cos, sin = timed_trig(frequencies, times[:, s:e], x1.dtype)
            g_angle = None
            for x, w_c, w_s, g, i in sides:
                if g is None:
                    continue
                gb = g[:, s:e].to(x.dtype)  # (H, n, R)
                xb = x[:, s:e, None, :]
                gy_c = torch.bmm(gb, w_c.transpose(1, 2)).view(h, l, k, d)
                gy_s = torch.bmm(gb, w_s.transpose(1, 2)).view(h, l, k, d)
                if grads[i] is not None:
                    grads[i][:, s:e] = torch.addcmul(gy_c * cos, gy_s, sin).sum(2)
                if grads[i + 1] is None and not want_angle:
                    continue
                # u_c = x cos a, u_s = x sin a serve W's gradient and the phases':
                # d cos a = −sin a da, d sin a = cos a da, so ∂L/∂a = g_s u_c − g_c u_s
                u_c, u_s = xb * cos, xb * sin
                if grads[i + 1] is not None:
                    grads[i + 1][0] += torch.bmm(u_c.view(h, l, k * d).transpose(1, 2), gb).to(acc)
                    grads[i + 1][1] += torch.bmm(u_s.view(h, l, k * d).transpose(1, 2), gb).to(acc)
                if want_angle:
                    if g_angle is None:
                        g_angle = gy_s * u_c
                    else:
                        g_angle.addcmul_(gy_s, u_c)
                    g_angle.addcmul_(gy_c, u_s, value=-1)
            if g_angle is None:
                if gt is not None:
                    gt[:, s:e] = 0
                continue
            g_angle = (g_angle.to(acc) * (2 * math.pi)).view(h, l, k * d)
            if gf is not None:
                gf += torch.bmm(times[:, s:e].to(acc)[:, None], g_angle)[:, 0]
            if gt is not None:
                gt[:, s:e] = torch.bmm(g_angle, f_kd)[..., 0]
        if gf is not None:
            grads[0] = gf.view(h, k, d).transpose(1, 2).to(frequencies.dtype)
        if gt is not None:
            grads[1] = gt.to(times.dtype)
        for i, w in ((3, w1), (5, w2)):
            if grads[i] is not None:
                grads[i] = grads[i].to(w.dtype)
        return tuple(grads)

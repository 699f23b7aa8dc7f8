"""FoX (softmax attention with a forget gate, Lin et al. 2025) in O(L) memory: blocks of queries,
each through PyTorch's fused kernel, no L × L tensor in forward or backward.

Letters: B = batch, L = length, H = num_heads, D = query/key dimension, E = value dimension,
W = window, Q = queries in a block, K = keys a block reads.

The gate's logit term is c_m − c_n, c_t = Σ_{s≤t} G_t the running sum of the log gates. In row m
c_m is the same for every key, so it cancels in the softmax: the bias is a per-KEY term −c_n,
and a per-key term is one more coordinate of the keys. With q' = [q, 1] and k' = [k, −c_n/s]
(s = 1/√D the logits' scale), s·q'·k' = s·q·k − c_n, so
``torch.nn.functional.scaled_dot_product_attention`` (whose CPU kernel is flash-style: it keeps
neither the logits nor their softmax, and recomputes them in its own backward) does the work,
and the gradient of c flows through that coordinate.

Precision: c reaches thousands of nats on long sequences (10⁴ · 2⁻²⁴ ≈ 6·10⁻⁴ nats apart in
float32), so each block of queries [s, e) uses c_n − r, r = (c_s + c_{e−1}) / 2 the middle of
its own range (summed in float64, then rounded): keys long before the block get a very negative
bias, where precision no longer matters; keys inside it a bias of at most half the block's drop
c_s − c_{e−1}, which is therefore kept ≤ 2 × :data:`FLASH_FOX_SPAN` nats over batch and heads (a
block ends early where the gates are strong, down to one query). The logits' error is then about
float32's eps × (|q·k|/√D summed over D roundings + :data:`FLASH_FOX_SPAN`).

Memory: each block reads the keys its queries reach, [0, e) (or the window's), through a
(Q, K) mask (causality, window, padding): O(L · Q) at a time. On the CPU forward calls the
kernel's operator that also returns each row's log-sum-exp, and keeps the inputs, the output and
those (O(L)); backward hands them to the kernel's backward operator one block at a time (as
FlashAttention-2 does), its heads in groups of about a MiB of widened keys. Elsewhere (or
without those operators) forward keeps the inputs only and backward recomputes each block. Either
way nothing of size L × L is formed or kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from spe.ops.common.checks import check_window
from spe.ops.softmax.checks import check_key_padding_mask, softmax_gates

__all__ = ["FLASH_FOX_BLOCK", "FLASH_FOX_SPAN", "flash_fox_attention"]

# Queries per block: the per-block (Q, K) mask and widened keys (each block copies the keys it
# reads) against the kernel's call overhead. Rough single runs on a loaded 2-core CPU (one causal
# layer, H = 4, D = 64, forward + backward): 256 the fastest of 128 / 256 / 512 at L = 2,048, within
# the noise of 512 at 4,096.
FLASH_FOX_BLOCK = 256

# The largest bias of a block's own keys (nats; half the most its queries may drop in c, over
# batch and heads): rounded at this magnitude, 512 · 2⁻²⁴ ≈ 3·10⁻⁵ nats. Gates of −0.1 per token
# leave blocks of 256 whole, −5 per token (one strongly gated head is enough) blocks of 205, −50
# (a head that forgets at once) blocks of 21. Each shorter block is one more kernel call and one
# more copy of the keys it reads: at L = 2,048 blocks of 51 took 1.8x the time of blocks of 256.
FLASH_FOX_SPAN = 512.0


def flash_fox_attention(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, *, window: int | None = None,
                        key_padding_mask: Tensor | None = None, block: int | None = None) -> Tensor:
    """Causal FoX, softmax_n(q_m·k_n/√D + c_m − c_n) v_n over n ≤ m (and m − n < W), c_t = Σ_{s≤t} G_s,
    in blocks of ``block`` queries, never forming an L × L tensor (module docstring).

    Args:
        q, k: (B, L, H, D).
        v: (B, L, H, E).
        log_decay: (B, L, H) log gates G_t ≤ 0, or (H,) a constant one
            (:func:`~spe.ops.softmax.checks.softmax_gates`).
        window: W, keys n ∈ (m − W, m] only; None: all n ≤ m.
        key_padding_mask: (B, L) bool, True at padding keys, which get no weight; every query
            needs one real key among those it sees (key 0 real, for instance).
        block: queries per block at most, ≥ 1 (None: :data:`FLASH_FOX_BLOCK`; fewer where
            the gates drop by more than 2 × :data:`FLASH_FOX_SPAN` nats within it).

    Returns:
        (B, L, H, E) in ``v``'s dtype. Float32 and bfloat16 inputs are computed in float32
        (float64 ones in float64), autocast off; gradients of q, k, v and the gates.

    Raises:
        ValueError: naming the shapes received unless q and k are (B, L, H, D) and v
            (B, L, H, E); a bad gate (:func:`~spe.ops.softmax.checks.softmax_gates`), window,
            padding mask or block.
    """
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"flash_fox_attention needs q, k (B, L, H, D) and v (B, L, H, E), got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    gates = softmax_gates(log_decay, tuple(q.shape))
    check_window(window)
    block = FLASH_FOX_BLOCK if block is None else block
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int (queries per block), got {block!r}")
    allowed = None
    if key_padding_mask is not None:
        allowed = check_key_padding_mask(key_padding_mask, k)  # (B, 1, 1, L), True: attend
    with torch.no_grad():
        spans = _spans(torch.cumsum(gates.to(torch.float64), 1), block, window)
    return _FlashFox.apply(q, k, v, gates, allowed, _Plan(window, spans))


def _compute_dtype(q: Tensor, k: Tensor, v: Tensor) -> torch.dtype:
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    return torch.promote_types(dtype, torch.float32)


def _spans(c: Tensor, block: int, window: int | None) -> list[tuple[int, int, int]]:
    """(s, e, lo) per block, queries [s, e) reading keys [lo, e): at most ``block`` queries, and
    c_s − c_{e−1} ≤ 2 × :data:`FLASH_FOX_SPAN` over batch and heads (one query at least); c (B, L, H)."""
    n, spans, s = c.shape[1], [], 0
    while s < n:
        drop = (c[:, s:s + 1] - c[:, s:s + block]).amax(dim=(0, 2))  # (Q,), non-decreasing: gates ≤ 0
        e = s + max(1, int((drop <= 2 * FLASH_FOX_SPAN).cumprod(0).sum()))
        spans.append((s, e, 0 if window is None else max(0, s - window + 1)))
        s = e
    return spans


def _middle(c: Tensor, s: int, e: int) -> Tensor:
    """r = (c_s + c_{e−1}) / 2, (B, 1, H): the reference of block [s, e)'s bias, the middle of
    its queries' range of c."""
    return (c[:, s:s + 1] + c[:, e - 1:e]) / 2


def _block_inputs(q: Tensor, k: Tensor, v: Tensor, rel: Tensor, *, s: int, lo: int, window: int | None,
                  allowed: Tensor | None, additive: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, float]:
    """One block's kernel inputs: queries s … s + Q − 1 (q (B, Q, H, D)), keys lo … lo + K − 1
    (k (B, K, H, D), v (B, K, H, E)), rel (B, K, H) = c_n − r (:func:`_middle`, float64); all in the compute
    dtype but rel. Returns q', k', v' (B, H, ·, width) (q' = [q, 1], k' = [k, −rel·√D], zeros
    beyond), the (Q, K) or (B, 1, Q, K) mask (bool, or 0 / −∞ in q's dtype when ``additive``)
    and the scale 1/√D; differentiable in q, k, v and rel."""
    d = q.shape[-1]
    scale = d ** -0.5
    width = _width(d, v.shape[-1])
    qx, kx, vx = (_widened(t, width) for t in (q, k, v))  # (B, H, ·, width), zeros beyond the inputs
    qx[..., d] = 1.0
    kx[..., d] = (rel / -scale).to(k.dtype).transpose(1, 2)
    lag = torch.arange(s, s + q.shape[1], device=q.device)[:, None] - torch.arange(
        lo, lo + k.shape[1], device=q.device)[None, :]
    keep = lag >= 0 if window is None else (lag >= 0) & (lag < window)
    if allowed is not None:
        keep = keep & allowed[..., lo:lo + k.shape[1]]
    if additive:
        keep = torch.where(keep, torch.zeros((), dtype=q.dtype, device=q.device), -math.inf)
    return qx, kx, vx, keep, scale


def _attend_block(q: Tensor, k: Tensor, v: Tensor, rel: Tensor, **where) -> Tensor:
    """One block through ``scaled_dot_product_attention`` (differentiable; :func:`_block_inputs`'
    arguments): (B, Q, H, E)."""
    qx, kx, vx, keep, scale = _block_inputs(q, k, v, rel, **where, additive=False)
    with torch.autocast(device_type=q.device.type, enabled=False):
        out = F.scaled_dot_product_attention(qx, kx, vx, attn_mask=keep, scale=scale)
    return out[..., :v.shape[-1]].transpose(1, 2)


def _fused_cpu(q: Tensor):
    """PyTorch's CPU flash kernel and its backward as operators ((output, logsumexp) forward, the
    backward from them), or None off the CPU or where this PyTorch has none: with them backward
    reuses each block's output and log-sum-exp instead of recomputing the block."""
    ops, name = torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"
    if q.device.type != "cpu" or not hasattr(ops, name + "_backward"):
        return None
    return getattr(ops, name), getattr(ops, name + "_backward")


def _width(d: int, e: int) -> int:
    """One width for q, k and v (the CPU kernel's rule): D + 1 (the gate's coordinate) or E,
    rounded up to 8 (vector-aligned rows)."""
    return -(-max(d + 1, e) // 8) * 8


def _widened(t: Tensor, width: int) -> Tensor:
    """t (B, N, H, X) as a new contiguous (B, H, N, width) tensor, zero beyond X (one copy, the
    layout the kernel reads)."""
    out = t.new_zeros(t.shape[0], t.shape[2], t.shape[1], width)
    out[..., :t.shape[-1]] = t.transpose(1, 2)
    return out


# Bytes of widened keys per backward call: a block's heads are differentiated in groups this size
# (one head at least), whose copies and gradients of the keys and values are what backward adds
# to the inputs' memory; more heads per call where they are short, where the calls' overhead counts.
_BACKWARD_BYTES = 2 ** 20


def _backward_parts(spans: list[tuple[int, int, int]], k: Tensor, v: Tensor):
    """(s, e, lo, heads) per backward call: the blocks widest first, each in groups of heads."""
    b, _, h, d = k.shape
    width = _width(d, v.shape[-1])
    for s, e, lo in reversed(spans):
        group = max(1, _BACKWARD_BYTES // (b * (e - lo) * width * 4))
        for h0 in range(0, h, group):
            yield s, e, lo, slice(h0, min(h, h0 + group))


@dataclass(frozen=True)
class _Plan:
    """The window and the blocks (s, e, lo) of one call, shared by forward and backward."""

    window: int | None
    spans: list[tuple[int, int, int]]


class _FlashFox(torch.autograd.Function):
    """Forward keeps the inputs (on the CPU also each block's widened output and log-sum-exp, O(L));
    backward differentiates one block at a time, its heads in groups."""

    @staticmethod
    def forward(ctx, q, k, v, gates, allowed, plan):
        dtype = _compute_dtype(q, k, v)
        c = torch.cumsum(gates.to(torch.float64), 1)
        fused = _fused_cpu(q)
        outs, ctx.kept = [], {}
        for s, e, lo in reversed(plan.spans):  # the widest block first: the later ones reuse its memory
            block = (q[:, s:e].to(dtype), k[:, lo:e].to(dtype), v[:, lo:e].to(dtype),
                     c[:, lo:e] - _middle(c, s, e))
            where = dict(s=s, lo=lo, window=plan.window, allowed=allowed)
            if fused is None:
                outs.append(_attend_block(*block, **where))
                continue
            qx, kx, vx, mask, scale = _block_inputs(*block, **where, additive=True)
            with torch.autocast(device_type="cpu", enabled=False):  # lse (B, H, Q)
                out, ctx.kept[s] = fused[0](qx, kx, vx, 0.0, False, attn_mask=mask, scale=scale)
            outs.append(out[..., :v.shape[-1]].transpose(1, 2))
        ctx.plan = plan
        exact = torch.cat(outs[::-1], 1) if outs else v.new_zeros(v.shape, dtype=dtype)
        result = exact.to(v.dtype)
        # the kernel's backward reads the output (its widened form is [o, 0 …]: v' is zero beyond
        # E) in the compute dtype: the result itself, or a copy kept beside a bfloat16 result
        ctx.exact = None if result is exact else exact
        ctx.save_for_backward(q, k, v, gates, allowed, result if result is exact else None)
        return result

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v, gates, allowed, exact = ctx.saved_tensors
        exact = ctx.exact if exact is None else exact
        dtype = _compute_dtype(q, k, v)
        c = torch.cumsum(gates.to(torch.float64), 1)
        grad = grad.to(dtype)
        # accumulated in the compute dtype (bf16 inputs: float32), c's in float64
        dq, dk, dv = (torch.zeros_like(t, dtype=dtype) for t in (q, k, v))
        dc = torch.zeros_like(c)
        for s, e, lo, hs in _backward_parts(ctx.plan.spans, k, v):
            block = (q[:, s:e, hs].to(dtype), k[:, lo:e, hs].to(dtype), v[:, lo:e, hs].to(dtype),
                     c[:, lo:e, hs] - _middle(c, s, e)[..., hs])
            where = dict(s=s, lo=lo, window=ctx.plan.window, allowed=allowed)
            if ctx.kept:
                gq, gk, gv, grel = _fused_block_grads(block, grad[:, s:e, hs], exact[:, s:e, hs],
                                                      ctx.kept[s][:, hs], where)
            else:
                leaves = [t.detach().requires_grad_() for t in block]
                with torch.enable_grad():
                    out = _attend_block(*leaves, **where)
                    # ⟨out, grad⟩ differentiated: the same gradients as grad_outputs=grad, without
                    # the shape checks that import sympy (≈ 40 MiB resident) on their first use
                    gq, gk, gv, grel = torch.autograd.grad((out * grad[:, s:e, hs]).sum(), leaves)
            dq[:, s:e, hs] = gq
            dk[:, lo:e, hs] += gk
            dv[:, lo:e, hs] += gv
            dc[:, lo:e, hs] += grel
            dc[:, s, hs] -= grel.sum(1) / 2  # rel = c_n − (c_s + c_{e−1}) / 2
            dc[:, e - 1, hs] -= grel.sum(1) / 2
        ctx.kept = ctx.exact = None
        # c_t = Σ_{u≤t} G_u: dG_u = Σ_{t≥u} dc_t
        dgates = dc.flip(1).cumsum(1).flip(1)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dgates.to(gates.dtype), None, None


def _fused_block_grads(block: tuple[Tensor, ...], grad: Tensor, out: Tensor, lse: Tensor,
                       where: dict) -> tuple[Tensor, ...]:
    """Gradients of one block's q, k, v (B, ·, h, ·) and rel (B, K, h) from the CPU kernel's
    backward, given the block's output ``out`` and output gradient ``grad`` (B, Q, h, E) and the
    forward's log-sum-exp ``lse`` (B, h, Q)."""
    q, k, v, rel = block
    d, e = q.shape[-1], v.shape[-1]
    qx, kx, vx, mask, scale = _block_inputs(*block, **where, additive=True)
    width = qx.shape[-1]
    with torch.autocast(device_type="cpu", enabled=False):
        gqx, gkx, gvx = _fused_cpu(q)[1](_widened(grad, width), qx, kx, vx, _widened(out, width),
                                         lse.contiguous(), 0.0, False, attn_mask=mask, scale=scale)
    # k' = [k, −rel/scale]: rel's gradient is −1/scale times that of the extra coordinate
    grel = (gkx[..., d] / -scale).transpose(1, 2).to(rel.dtype)
    return (gqx[..., :d].transpose(1, 2), gkx[..., :d].transpose(1, 2), gvx[..., :e].transpose(1, 2), grel)

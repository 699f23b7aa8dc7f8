"""Softmax attention through PyTorch's FlexAttention (``torch.nn.attention.flex_attention``):
FoX's forget gate, linear distance penalties and relative key scores as a ``score_mod``,
causality, a window and key padding as a block mask, so the L × L bias is never materialised and
masked blocks are skipped.

Letters: B = batch, L = length (Lq queries, Lk keys), H = num_heads, D = query/key dimension,
E = value dimension, W = window.

On CUDA the call is ``torch.compile``d (FlexAttention's fused Triton kernels, forward and
backward). Its backward does not run on the CPU (PyTorch 2.13), so there the per-block form
(:func:`~spe.ops.softmax.chunk.softmax_attention`) stays the path and the reference; this one
runs eagerly on the CPU for the forward only. :func:`choose_softmax_impl` picks between the two
for a call and says why flex cannot take one.

FoX's bias Σ_{n<t≤m} G_t is c_m − c_n with c the running sum of the gates. A float32 c would
lose the bias's precision once c reaches thousands of nats (10⁴ · 2⁻²⁴ ≈ 6·10⁻⁴ nats;
:mod:`spe.ops.decay.sums`), and the kernel cannot form each entry from its own terms as the
per-block form does. So c is summed in float64 and passed as two float32 parts, c = hi + lo
(lo the float32 rounding of c − hi): (hi_m − hi_n) + (lo_m − lo_n) keeps float32's relative
precision on the difference itself.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch
from torch import Tensor

from spe.ops.common.checks import check_window
from spe.ops.softmax.checks import check_key_padding_mask, softmax_gates

__all__ = ["SOFTMAX_IMPLS", "auto_flex_failure", "check_softmax_impl", "choose_softmax_impl",
           "flex_available", "flex_fallback_reason", "flex_softmax_attention", "run_flex"]

# 'auto': flex on CUDA for a gate, a window or a score term it takes, the per-block form elsewhere
# (choose_softmax_impl); 'flex' asks for it (falling back with a warning that says why where it
# cannot); 'blocks' the per-block form.
SOFTMAX_IMPLS = ("auto", "flex", "blocks")


def check_softmax_impl(impl: str) -> str:
    """``impl``, checked.

    Raises:
        ValueError: naming the value and :data:`SOFTMAX_IMPLS`, unless it is one of them.
    """
    if impl not in SOFTMAX_IMPLS:
        raise ValueError(f"softmax_impl must be one of {', '.join(SOFTMAX_IMPLS)}, got {impl!r}")
    return impl


@functools.cache
def _flex_module():
    """``torch.nn.attention.flex_attention`` or None (PyTorch before 2.5 has none)."""
    try:
        from torch.nn.attention import flex_attention as module
    except ImportError:
        return None
    return module if hasattr(module, "flex_attention") and hasattr(module, "create_block_mask") else None


def flex_available() -> bool:
    """Whether this PyTorch has FlexAttention."""
    return _flex_module() is not None


def _flex_call(flex, q: Tensor, k: Tensor, v: Tensor, *, block_mask, scale: float, c_hi: Tensor | None,
               c_hi_keys: Tensor | None, c_lo: Tensor | None, slopes: Tensor | None, rel: Tensor | None,
               rel_low: int, rel_high: int) -> Tensor:
    """``flex`` (FlexAttention) on (B, H, L, ·) tensors with FoX's bias (c_hi, c_lo: (B, H, L), the
    running sum's two float32 parts; c_hi_keys: a copy of c_hi read at the keys), distance slopes
    (H,) and relative scores (B, H, Lq, R), column clip(n − m, rel_low, rel_high) − rel_low; each
    None or not."""

    def score_mod(score, batch, head, q_idx, kv_idx):
        if c_hi is not None:
            score = score + ((c_hi[batch, head, q_idx] - c_hi_keys[batch, head, kv_idx])
                             + (c_lo[batch, head, q_idx] - c_lo[batch, head, kv_idx]))
        if slopes is not None:
            score = score - slopes[head] * (q_idx - kv_idx).abs()
        if rel is not None:
            score = score + rel[batch, head, q_idx, torch.clamp(kv_idx - q_idx, rel_low, rel_high) - rel_low]
        return score

    plain = c_hi is None and slopes is None and rel is None
    return flex(q, k, v, score_mod=None if plain else score_mod, block_mask=block_mask, scale=scale)


@functools.cache
def _compiled_call():
    # compiled once per process, with the bias tensors as arguments (not closure cells): its graphs
    # are keyed on shapes, dtypes and which biases are present, not on the tensors of a call
    return torch.compile(_flex_call, dynamic=False)


def flex_fallback_reason(q: Tensor, k: Tensor, v: Tensor, *, log_decay: Tensor | None = None,
                         score_term: object | None = None) -> str | None:
    """Why :func:`flex_softmax_attention` cannot take this call, or None if it can.

    Args:
        q, k, v: the call's (B, Lq, H, D), (B, Lk, H, D), (B, Lk, H, E).
        log_decay: FoX's gate, if any (its gradient counts as one of the inputs').
        score_term: a score term (:class:`~spe.attention.kernels.ScoreTerm`); flex takes one
            only through its ``flex_arguments(q)`` (distance slopes, relative scores of the
            queries), not one that forms the scores itself (Shaw's value terms, the SPE oracle,
            PaTH).

    Returns:
        A sentence naming the obstacle, or None.
    """
    if not flex_available():
        return f"this PyTorch ({torch.__version__}) has no torch.nn.attention.flex_attention"
    if score_term is not None and not callable(getattr(score_term, "flex_arguments", None)):
        return f"the score term {type(score_term).__name__} forms its scores itself (no flex_arguments)"
    if q.device.type not in ("cuda", "cpu"):
        return f"FlexAttention runs on CUDA and the CPU here, not {q.device.type}"
    if torch.float64 in (q.dtype, k.dtype, v.dtype):
        return "float64 inputs (FlexAttention's kernels run float32, bfloat16 and float16)"
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, log_decay)):
        return "FlexAttention's backward does not run on the CPU"
    if q.device.type == "cuda" and min(q.shape[-1], v.shape[-1]) < 16:
        return (f"head dimensions below 16 (D = {q.shape[-1]}, E = {v.shape[-1]}): FlexAttention's CUDA "
                f"kernels need 16")
    if q.shape[1] == 0 or k.shape[1] == 0:
        return "no queries or no keys"
    return None


def choose_softmax_impl(impl: str, q: Tensor, k: Tensor, v: Tensor, *, log_decay: Tensor | None = None,
                        score_term: object | None = None, window: int | None = None) -> str:
    """``'flex'`` or ``'blocks'`` for a call, under the option ``impl`` (:data:`SOFTMAX_IMPLS`).

    ``auto`` takes flex on CUDA for what PyTorch's fused causal kernel cannot do itself (FoX's
    gate, a score term, a window shorter than the sequence: each a materialised bias or mask
    there) when :func:`flex_fallback_reason` finds no obstacle; plain attention, with or without
    key padding, stays on ``scaled_dot_product_attention``. ``flex`` takes it for any call on
    any device unless there is an obstacle, then warns (UserWarning) and falls back;
    ``blocks`` never takes it.

    Raises:
        ValueError: on an unknown ``impl``.
    """
    if check_softmax_impl(impl) == "blocks":
        return "blocks"
    if impl == "auto" and (q.device.type != "cuda" or _AUTO_FAILURE or (
            log_decay is None and score_term is None and (window is None or window >= q.shape[1]))):
        return "blocks"
    reason = flex_fallback_reason(q, k, v, log_decay=log_decay, score_term=score_term)
    if reason is None:
        return "flex"
    if impl == "flex":  # Python's default filter shows it once per reason and place
        warnings.warn(f"softmax_impl='flex' falls back to the per-block softmax: {reason}", stacklevel=3)
    return "blocks"


# The first failure of FlexAttention under 'auto' in this process (a PyTorch whose compiler cannot
# lower a case): 'auto' then keeps the per-block form, so a training run does not stop on it.
_AUTO_FAILURE: list[str] = []


def auto_flex_failure() -> str | None:
    """The error that turned ``auto``'s FlexAttention off in this process (:func:`run_flex`), or None."""
    return _AUTO_FAILURE[0] if _AUTO_FAILURE else None


def run_flex(impl: str, call):
    """``call()`` (a :func:`flex_softmax_attention` call chosen by :func:`choose_softmax_impl`).
    Under ``auto`` an error other than the caller's (ValueError, TypeError) or running out of
    memory turns flex off for the process with a warning naming it, and None is returned (the
    caller runs the per-block form); under ``flex`` it propagates."""
    if impl != "auto":
        return call()
    try:
        return call()
    except (ValueError, TypeError, torch.OutOfMemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - a compiler failure of any kind: the per-block form still works
        first_line = (str(e).strip().splitlines() or [""])[0]
        _AUTO_FAILURE.append(f"{type(e).__name__}: {first_line}")
        warnings.warn(f"FlexAttention failed ({_AUTO_FAILURE[0]}): softmax_impl='auto' keeps the per-block "
                      f"softmax in this process", stacklevel=3)
        return None


@functools.lru_cache(maxsize=16)
def _static_block_mask(lq: int, lk: int, causal: bool, window: int | None, device: str):
    """The block mask of causality and a window, which depends on the shapes only: built once per shape."""
    return _flex_module().create_block_mask(_mask_mod(causal, window, None), None, None, lq, lk, device=device)


def _mask_mod(causal: bool, window: int | None, padding: Tensor | None):
    def mask_mod(b, h, q_idx, kv_idx):
        keep = q_idx >= 0  # all True, in the index's shape
        if causal:
            keep = keep & (q_idx >= kv_idx)
        if window is not None:
            keep = keep & (q_idx - kv_idx < window)
        if padding is not None:
            keep = keep & ~padding[b, kv_idx]
        return keep

    return mask_mod


def flex_softmax_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True, window: int | None = None,
                           key_padding_mask: Tensor | None = None, log_decay: Tensor | None = None,
                           distance_slopes: Tensor | None = None, relative_scores: Tensor | None = None,
                           max_distance: int | None = None, scale: float | None = None,
                           compile: bool | None = None) -> Tensor:
    """softmax_n(q_m·k_n · scale + b_mn) v_n through FlexAttention, b_mn the sum of FoX's bias
    Σ_{n<t≤m} G_t, a distance penalty −s_h·|m − n| and a relative score S[m, r(n − m)] (each
    where given), over the keys kept: n ≤ m when causal, m − n < W with a window, n not padding.
    Equals :func:`~spe.ops.softmax.chunk.softmax_attention` (with ``log_decay``) and the score
    encodings' ``attend`` (with their ``flex_arguments``); the float64
    reference is :func:`~spe.ops.softmax.naive.softmax_attention_reference`.

    Args:
        q: (B, Lq, H, D).
        k: (B, Lk, H, D).
        v: (B, Lk, H, E).
        causal: mask keys after each query.
        window: W, causal sliding window (None: the whole past).
        key_padding_mask: (B, Lk) bool, True at padding keys (no weight); non-causal only;
            every query needs one real key.
        log_decay: FoX's forget gate, (B, L, H) log gates G_t ≤ 0 or (H,) a constant one;
            causal only, Lq = Lk. None: none.
        distance_slopes: (H,) slopes s_h ≥ 0 of a linear distance penalty (Press et al. 2022).
            None: none.
        relative_scores: (B, Lq, H, R) scores by clipped relative position (relative key
            embeddings' q_m·e_r/√D, Huang et al. 2018): query m gains column r + k for key n,
            r = n − m clipped to [−k, R − k − 1] (causal: R = k + 1, r ≤ 0; else R = 2k + 1).
            None: none.
        max_distance: k of ``relative_scores`` (required with them).
        scale: of the logits; None: 1/√D.
        compile: run ``torch.compile``d FlexAttention (fused kernels; needed for speed and for
            its backward); None: on CUDA only. Eager runs the forward only on the CPU.

    Returns:
        (B, Lq, H, E) in ``v``'s dtype.

    Raises:
        ValueError: on a window without ``causal`` or not positive, a padding mask with
            ``causal`` or of the wrong shape, a gate without ``causal`` or with Lq ≠ Lk or of
            a bad shape or value, slopes that are not (H,), relative scores not (B, Lq, H, R)
            with R > k ≥ 0.
        RuntimeError: if this PyTorch has no FlexAttention (:func:`flex_available`).

    Precision: autocast off; the logits and the softmax are float32 inside the kernel (bf16
    and fp16 inputs stay so on CUDA; the CPU computes in at least float32); FoX's running
    sum c is float64, passed as two float32 parts (module docstring).
    """
    module = _flex_module()
    if module is None:
        raise RuntimeError(flex_fallback_reason(q, k, v))
    b, lq, h, d = q.shape
    lk = k.shape[1]
    if window is not None:
        if not causal:
            raise ValueError("a sliding window needs causal attention")
        check_window(window)
    padding = None
    if key_padding_mask is not None:
        if causal:
            raise ValueError("key_padding_mask is for non-causal attention (a causal model has no padding before "
                             "its last real token)")
        check_key_padding_mask(key_padding_mask, k)
        padding = key_padding_mask.to(q.device)
    c_hi = c_hi_keys = c_lo = slopes = None
    if log_decay is not None:
        if not causal or lk != lq:
            raise ValueError(f"a forget gate (log_decay) needs causal attention with as many queries as keys, got "
                             f"causal={causal}, {lq} queries and {lk} keys")
        c = torch.cumsum(softmax_gates(log_decay, q.shape).to(torch.float64), dim=1).permute(0, 2, 1)  # (B, H, L)
        c_hi = c.to(torch.float32).contiguous()
        # the remainder is a constant: c's gradient flows through c_hi alone (∂c_hi/∂c = 1)
        c_lo = (c - c_hi.to(torch.float64)).detach().to(torch.float32).contiguous()
        # compiled FlexAttention (PyTorch 2.11 on an H100) refuses to differentiate a captured
        # tensor indexed twice in score_mod: the keys read their own copy, autograd sums the two
        c_hi_keys = c_hi.clone()
    if distance_slopes is not None:
        if distance_slopes.shape != (h,):
            raise ValueError(f"distance_slopes must be (num_heads,) = ({h},), got {tuple(distance_slopes.shape)}")
        slopes = distance_slopes.to(q.device, torch.float32)
    rel, low, high = _relative(relative_scores, max_distance, q)

    if padding is not None:
        block_mask = module.create_block_mask(_mask_mod(causal, window, padding), b, None, lq, lk, device=q.device)
    elif causal or window is not None:
        block_mask = _static_block_mask(lq, lk, causal, window, str(q.device))
    else:
        block_mask = None
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    if q.device.type != "cuda":
        dtype = torch.promote_types(dtype, torch.float32)
    compiled = q.device.type == "cuda" if compile is None else compile
    run = _compiled_call() if compiled else _flex_call
    with torch.autocast(device_type=q.device.type, enabled=False), warnings.catch_warnings():
        # eager is asked for (the CPU's forward): PyTorch's advice to compile is noise here
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        q, k, v_in = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
        out = run(module.flex_attention, q, k, v_in, block_mask=block_mask,
                  scale=1.0 / math.sqrt(d) if scale is None else scale, c_hi=c_hi, c_hi_keys=c_hi_keys, c_lo=c_lo, slopes=slopes,
                  rel=rel, rel_low=low, rel_high=high)
    return out.transpose(1, 2).to(v.dtype)


def _relative(scores: Tensor | None, max_distance: int | None, q: Tensor) -> tuple[Tensor | None, int, int]:
    """Relative scores (B, Lq, H, R) as (B, H, Lq, R) in at least float32, and the clip range of n − m."""
    if scores is None:
        return None, 0, 0
    b, lq, h, _ = q.shape
    k = max_distance
    if isinstance(k, bool) or not isinstance(k, int) or k < 0 or scores.dim() != 4 \
            or scores.shape[:3] != (b, lq, h) or scores.shape[3] <= k:
        raise ValueError(f"relative_scores must be (batch, queries, heads, R) = ({b}, {lq}, {h}, R) with R > "
                         f"max_distance ≥ 0, got {tuple(scores.shape)} and max_distance={max_distance!r}")
    dtype = torch.promote_types(scores.dtype, torch.float32)
    return scores.to(dtype).permute(0, 2, 1, 3).contiguous(), -k, scores.shape[3] - k - 1

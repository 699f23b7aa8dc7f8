"""PaTH attention (spe.ops.path): the chunked and flash-style forms and the decoding step against
the float64 definition, the definition against explicit D × D products, the special cases it must
reduce to, causality, what the flash-style form keeps, the choice between the forms, and the input
checks. fla's own reference, when importable, is the oracle."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import LargestTensor

from spe.ops import path_attention, path_attention_step, path_prefill_cache, softmax_attention
from spe.ops.path import chunk as path_chunk
from spe.ops.path import flash, path_attention_reference, path_logits_reference
from spe.ops.path.flash import flash_path_attention

B, H, D = 2, 3, 8


def _inputs(length, *, dtype=torch.float64, seed=0, beta_range=(0.0, 2.0), sharp=1.0, gate=True):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, length, H, D, generator=g, dtype=dtype) for _ in range(3))
    q, k = q * sharp, k * sharp
    w = F.normalize(torch.randn(B, length, H, D, generator=g, dtype=dtype), dim=-1)
    lo, hi = beta_range
    beta = lo + (hi - lo) * torch.rand(B, length, H, generator=g, dtype=dtype)
    log_decay = 0.3 * torch.rand(B, length, H, generator=g, dtype=dtype).log() if gate else None
    return q, k, v, w, beta, log_decay


def _grads(fn, q, k, v, w, beta, log_decay, **kwargs):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, w, beta)]
    gate = None if log_decay is None else log_decay.detach().clone().requires_grad_()
    out = fn(*leaves, log_decay=gate, **kwargs)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    probe = probe.to(out.dtype)
    wrt = leaves + ([] if gate is None else [gate])
    return out, torch.autograd.grad((out * probe).sum(), wrt)


# --- the definition ------------------------------------------------------------------------


def test_reference_logits_are_the_explicit_product_of_householder_matrices():
    # q_mᵀ H_m H_{m−1} ⋯ H_{n+1} k_n: the order matters (the reverse product differs), and
    # the key's own H_n and the H after the query never enter
    q, k, _, w, beta, _ = _inputs(9, gate=False)
    eye = torch.eye(D, dtype=torch.float64)
    h_t = eye - beta[..., None, None] * w[..., :, None] * w[..., None, :]  # (B, L, H, D, D)
    logits = path_logits_reference(q, k, w, beta)
    for m, n in ((8, 0), (5, 2), (4, 3), (6, 6)):
        product, reverse = eye.expand(B, H, D, D), eye.expand(B, H, D, D)
        for t in range(m, n, -1):
            product, reverse = product @ h_t[:, t], h_t[:, t] @ reverse
        expected = torch.einsum("bhd,bhde,bhe->bh", q[:, m], product, k[:, n])
        torch.testing.assert_close(logits[:, :, m, n], expected, rtol=1e-12, atol=1e-12)
        if m - n > 1:
            assert not torch.allclose(torch.einsum("bhd,bhde,bhe->bh", q[:, m], reverse, k[:, n]), expected)


@pytest.mark.parametrize("gate", [False, True])
def test_with_beta_zero_it_is_softmax_attention_and_with_a_gate_fox(gate):
    # H_t = I: plain causal softmax; the gate enters the logits unscaled (FoX's F_m − F_n)
    q, k, v, w, _, log_decay = _inputs(20, gate=gate)
    beta = torch.zeros(B, 20, H, dtype=torch.float64)
    expected = softmax_attention(q, k, v, causal=True, log_decay=log_decay)
    for fn in (path_attention, path_attention_reference):
        out = fn(q, k, v, w, beta, log_decay=log_decay)
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_beta_two_reflects_the_past_keys():
    # a reflection keeps norms: with one key and H = reflection about w, q·(H k) = (H q)·k
    q, k, v, w, _, _ = _inputs(2, gate=False)
    beta = torch.full((B, 2, H), 2.0, dtype=torch.float64)
    reflected = k[:, 0] - 2 * (k[:, 0] * w[:, 1]).sum(-1, keepdim=True) * w[:, 1]
    logits = path_logits_reference(q, k, w, beta)
    torch.testing.assert_close(logits[:, :, 1, 0], (q[:, 1] * reflected).sum(-1))
    torch.testing.assert_close(reflected.norm(dim=-1), k[:, 0].norm(dim=-1))


# --- the chunked form against the definition, forward and backward -------------------------


@pytest.mark.parametrize("length, chunk_size, beta_range, sharp", [
    (37, 8, (0.0, 2.0), 1.0),      # L not a multiple of C
    (37, 1, (0.0, 2.0), 1.0),      # one position per chunk: everything between chunks
    (16, 64, (1.9, 2.0), 1.0),     # one chunk; β near 2 (near reflections)
    (300, 64, (1.95, 2.0), 1.0),   # long: five chunks, β near 2
    (64, 16, (0.0, 2.0), 4.0),     # sharp attention (logits of tens)
])
def test_chunked_equals_the_float64_definition_forward_and_backward(length, chunk_size, beta_range, sharp):
    _assert_is_the_definition(path_attention, _inputs(length, beta_range=beta_range, sharp=sharp),
                              chunk_size=chunk_size)


def _assert_is_the_definition(fn, inputs, *, float32=False, **kwargs):
    """fn's output and gradients (q, k, v, w, β, gate) equal the float64 definition's: to float64
    rounding, or with ``float32`` on inputs cast to float32, to its rounding (~1e-7 relative per
    operation over a few hundred operations per entry)."""
    ref, ref_grads = _grads(path_attention_reference, *inputs)
    out, grads = _grads(fn, *(t if t is None or not float32 else t.float() for t in inputs), **kwargs)
    assert out.dtype == (torch.float32 if float32 else torch.float64)
    close = dict(rtol=1e-4, atol=1e-5) if float32 else dict(rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(out.double(), ref, **close)
    close = dict(rtol=1e-3, atol=1e-4) if float32 else dict(rtol=1e-8, atol=1e-8)
    for name, got, want in zip(("q", "k", "v", "w", "beta", "log_decay"), grads, ref_grads):
        torch.testing.assert_close(got.double(), want, **close, msg=f"gradient w.r.t. {name}")


def test_float32_chunked_is_the_float64_definition_to_float32_rounding():
    _assert_is_the_definition(path_attention, _inputs(130, beta_range=(1.5, 2.0)), float32=True)


def test_outputs_ignore_the_future():
    q, k, v, w, beta, log_decay = _inputs(24)
    later = [t.clone() for t in (q, k, v, w, beta, log_decay)]
    for t in later:
        t[:, 11:] = t[:, 11:].flip(1)  # every input after position 10 changes (w stays unit, β in range)
    torch.testing.assert_close(path_attention(*later[:5], log_decay=later[5], chunk_size=4)[:, :11],
                               path_attention(q, k, v, w, beta, log_decay=log_decay, chunk_size=4)[:, :11])


# --- the flash-style form -------------------------------------------------------------------


def _gates(kind, length, seed=3):
    """FoX gates (B, L, H): none, FoX's usual, near 0 (almost no decay), or a mix of near 0 and
    near −∞ (some steps forget everything before them)."""
    u = torch.rand(B, length, H, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return {"none": None, "fox": 0.3 * u.log(), "near 0": -1e-7 * u,
            "near −∞": torch.where(u < 0.3, -1e4 * (1 + u), -0.01 * u)}[kind]


@pytest.mark.parametrize("length, chunk, block, tile, beta_range, sharp, gates", [
    (37, 8, 16, 8, (0.0, 2.0), 1.0, "fox"),        # ragged last chunk; blocks of 2 chunks, tiles of 1
    (70, 4, 12, 20, (0.0, 2.0), 1.0, "none"),      # 18 chunks, blocks of 3, tiles of 5: ragged tiles too
    (64, 16, 16, 16, (0.0, 2.0), 4.0, "fox"),      # sharp attention (logits of tens)
    (45, 4, 8, 8, (0.0, 0.02), 1.0, "near 0"),     # β near 0 (H_t ≈ I), gates near 0
    (45, 4, 8, 8, (1.98, 2.0), 1.0, "near −∞"),    # near reflections, gates that forget everything
    (30, 1, 3, 2, (0.0, 2.0), 1.0, "fox"),         # one position per chunk
])
def test_flash_equals_the_float64_definition_forward_and_backward(length, chunk, block, tile, beta_range, sharp,
                                                                   gates):
    q, k, v, w, beta, _ = _inputs(length, beta_range=beta_range, sharp=sharp)

    def run(*args, log_decay):
        return flash_path_attention(*args, log_decay, scale=D ** -0.5, chunk_size=chunk, block=block, tile=tile)

    _assert_is_the_definition(run, (q, k, v, w, beta, _gates(gates, length)))


def test_float32_flash_is_the_float64_definition_to_float32_rounding():
    _assert_is_the_definition(path_attention, _inputs(200, beta_range=(1.5, 2.0)), float32=True, impl="flash",
                              chunk_size=16)


def _saved_bytes(length, impl):
    """Bytes autograd keeps for the backward of one PaTH-FoX call (B = 1, H = 1, D = 8)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, length, 1, D, generator=g, requires_grad=True) for _ in range(3))
    w = F.normalize(torch.randn(1, length, 1, D, generator=g), dim=-1).requires_grad_()
    beta = torch.rand(1, length, 1, generator=g).mul(2).requires_grad_()
    gate = torch.rand(1, length, 1, generator=g).log().mul(0.1).requires_grad_()
    kept = []

    def pack(t):
        kept.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        path_attention(q, k, v, w, beta, log_decay=gate, impl=impl)
    return sum(kept)


def test_flash_keeps_for_backward_memory_linear_in_the_length():
    # the chunked form keeps the (B, H, L, L) logits: 4× from L to 2L (the measure sees it)
    assert _saved_bytes(1024, "chunk") > 3.3 * _saved_bytes(512, "chunk")
    ratio = _saved_bytes(2048, "flash") / _saved_bytes(1024, "flash")
    assert 1.8 < ratio < 2.2, ratio


@pytest.mark.parametrize("gate", [False, True])
def test_flash_never_forms_an_l_by_l_tensor_forward_or_backward(gate):
    length = 1024
    q, k, v, w, beta, log_decay = (None if t is None else t[:1, :, :1].float().requires_grad_()
                                   for t in _inputs(length, gate=gate))
    with LargestTensor() as seen:
        path_attention(q, k, v, w, beta, log_decay=log_decay, impl="flash").square().sum().backward()
    # one block's tile of logits (128 × 512) is the largest; L² would be 1,048,576
    assert seen.largest <= 128 * 512, seen.largest
    assert q.grad is not None and w.grad is not None and beta.grad is not None


def test_flash_forms_each_chunks_terms_once_forward_and_once_backward(monkeypatch):
    """The UT terms (triangular solves) are the flash form's fixed cost per position: forward keeps
    the keys' k̂ and P the blocks formed, backward forms each block's terms once for all its gradients
    (they were formed 5 times a step: 5 × 9 chunks here)."""
    formed = []
    original = flash.chunk_terms
    monkeypatch.setattr(flash, "chunk_terms", lambda *a: formed.append(a[1].shape[1]) or original(*a))
    q, k, v, w, beta, log_decay = (t.requires_grad_() for t in _inputs(70))  # 9 chunks of 8, the last ragged
    flash_path_attention(q, k, v, w, beta, log_decay, scale=D ** -0.5, chunk_size=8, block=24,
                         tile=16).square().sum().backward()
    assert sum(formed) == 2 * 70 and len(formed) == 2 * 3  # blocks of 3 chunks: 3 forward, 3 backward


def test_auto_takes_the_flash_form_from_its_threshold(monkeypatch):
    calls = []
    original = flash.flash_path_attention  # path_attention (spe.ops.path.chunk) dispatches by its names
    monkeypatch.setattr(path_chunk, "flash_path_attention",
                        lambda *a, **kw: calls.append(a[0].shape[1]) or original(*a, **kw))
    monkeypatch.setattr(path_chunk, "FLASH_MIN_LENGTH", 20)
    for length in (19, 20, 41):
        inputs = _inputs(length)
        out = path_attention(*inputs[:5], log_decay=inputs[5], chunk_size=8)
        torch.testing.assert_close(out, path_attention(*inputs[:5], log_decay=inputs[5], chunk_size=8, impl="chunk"),
                                   rtol=1e-10, atol=1e-10)
    assert calls == [20, 41]


# --- decoding -------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["chunk", "flash"])
@pytest.mark.parametrize("gate", [False, True])
def test_steps_and_a_prefill_then_steps_equal_the_parallel_form(gate, impl):
    q, k, v, w, beta, log_decay = _inputs(21, gate=gate)
    parallel = path_attention(q, k, v, w, beta, log_decay=log_decay, chunk_size=4, impl=impl)
    one = lambda t: None if t is None else t[:, i:i + 1]  # noqa: E731
    for start in (0, 10):  # from nothing; after a prompt of 10 positions
        cut = slice(None, start)
        prompt_gate = None if log_decay is None else log_decay[:, cut]
        cache = None if not start else path_prefill_cache(k[:, cut], v[:, cut], w[:, cut], beta[:, cut],
                                                           log_decay=prompt_gate, chunk_size=4)
        outs = []
        for i in range(start, 21):
            y, cache = path_attention_step(one(q), one(k), one(v), one(w), one(beta), cache,
                                           log_decay=one(log_decay))
            outs.append(y)
        torch.testing.assert_close(torch.cat(outs, 1), parallel[:, start:], rtol=1e-10, atol=1e-10)
        assert cache.position == 21 and cache.keys.shape[1] == 21


def test_the_cache_holds_keys_carried_to_the_newest_position():
    q, k, v, w, beta, _ = _inputs(6, gate=False)
    cache = path_prefill_cache(k, v, w, beta)
    expected = k[:, 2]
    for t in range(3, 6):
        expected = expected - beta[:, t, :, None] * (expected * w[:, t]).sum(-1, keepdim=True) * w[:, t]
    torch.testing.assert_close(cache.keys[:, 2], expected)
    torch.testing.assert_close(cache.keys[:, 5], k[:, 5])


def test_scale_multiplies_q_dot_k_in_every_form():
    q, k, v, w, beta, log_decay = _inputs(9)
    # scale s on q·k equals the default scale on queries multiplied by s·√D
    expected = path_attention_reference(q * 0.3 * math.sqrt(D), k, v, w, beta, log_decay=log_decay)
    torch.testing.assert_close(path_attention(q, k, v, w, beta, log_decay=log_decay, scale=0.3), expected)
    y, _ = path_attention_step(q[:, :1], k[:, :1], v[:, :1], w[:, :1], beta[:, :1], None,
                               log_decay=log_decay[:, :1], scale=0.3)
    torch.testing.assert_close(y, expected[:, :1])


# --- fla's reference ------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["chunk", "flash"])
def test_equals_fla_naive_path_attn(impl):
    naive = pytest.importorskip(
        "fla.ops.path_attn.naive",
        reason="flash-linear-attention is not installed (no network here); this compares with its "
               "naive_path_attn when it is").naive_path_attn
    q, k, v, w, beta, log_decay = (t.float() for t in _inputs(70, beta_range=(1.0, 2.0)))
    scale = D ** -0.5
    ours = path_attention(q, k, v, w, beta, log_decay=log_decay, impl=impl)
    # fla multiplies its gate g by the scale with the logits: our gate is g·scale
    theirs = naive(q, k, v, w, beta, log_decay / scale, scale, chunk_size=16)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    theirs = naive(q, k, v, w, beta, torch.zeros_like(log_decay), scale, chunk_size=16)
    torch.testing.assert_close(path_attention(q, k, v, w, beta, impl=impl), theirs, rtol=1e-4, atol=1e-5)


# --- input checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(q=a["q"][0]),
     r"q must be \(batch, length, num_heads, head_dim\), got shape \(5, 3, 8\)"),
    (lambda a: a.update(k=a["k"][:, :4]), r"k must have q's shape \(2, 5, 3, 8\).*got \(2, 4, 3, 8\)"),
    (lambda a: a.update(v=a["v"][:, :, :2]), r"v must be \(B, L, H, E\).*got \(2, 5, 2, 8\)"),
    (lambda a: a.update(beta=a["beta"][..., None]),
     r"beta must be \(B, L, H\) = \(2, 5, 3\), got \(2, 5, 3, 1\)"),
    (lambda a: a.update(q=a["q"].long()), r"q must be floating point, got dtype torch.int64"),
    (lambda a: a.update(beta=a["beta"] + 2.5), r"beta must lie in \[0, 2\]"),
    (lambda a: a.update(w=2 * a["w"]), r"w must have unit norm.*a ‖w_t‖ of 2 was received"),
    (lambda a: a.update(log_decay=-a["log_decay"] + 0.1), r"log_decay|> 0"),
    (lambda a: a.update(scale=-1.0), r"scale must be a positive finite float or None \(1/√D\), got -1.0"),
    (lambda a: a.update(impl="fast"), r"impl must be one of auto, chunk, flash, got 'fast'"),
])
def test_bad_inputs_are_refused_naming_what_was_received(change, message):
    q, k, v, w, beta, log_decay = _inputs(5)
    args = dict(q=q, k=k, v=v, w=w, beta=beta, log_decay=log_decay, scale=None)
    change(args)
    with pytest.raises(ValueError, match=message):
        path_attention(**args)

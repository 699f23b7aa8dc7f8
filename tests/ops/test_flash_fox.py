"""FoX in O(L) memory (spe.ops.softmax.flash): equal to the float64 definition forward and
backward (q, k, v and the log gates) at ragged lengths, sharp logits, gates near 0 and near −∞,
windows, key padding, bfloat16 inputs; no tensor of size L × L in forward or backward; the layer
picks it from FLASH_FOX_MIN_LENGTH positions on with the same output as the one-bias form, and
decoding step by step still equals the parallel pass."""

import math
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import spe
import spe.ops.softmax.chunk as chunk
import spe.ops.softmax.flash as flash
from spe.encodings.gates import ScalarGate
from spe.ops.softmax import flash_fox_attention, softmax_attention, softmax_attention_reference

U32 = 2.0 ** -24
U16 = 2.0 ** -8  # bfloat16's unit roundoff


def _mild(g, shape):
    return 0.3 * torch.rand(shape, generator=g).log()  # mean −0.3 per token, some near −∞


def _near_zero(g, shape):
    return -1e-4 * torch.rand(shape, generator=g)


def _minus_50(g, shape):
    # −50 per token: each query keeps its own key (e^{−50} for the one before); 180 tokens sum to −9,000
    return torch.full(shape, -50.0)


def _strong(g, shape):
    """−8 … 0, −30 every 7th position on head 0 (≈ −9,000 nats over 1,200 positions), long
    memories (≥ −0.02) on the other heads."""
    gates = -8 * torch.rand(shape, generator=g)
    gates[:, ::7, 0] = -30.0
    gates[:, :, 1:] = -0.02 * torch.rand(gates[:, :, 1:].shape, generator=g)
    return gates


def _inputs(n, *, b=2, h=3, d=8, e=None, scale=1.0, gates=_mild, padding=False, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k = (scale * torch.randn(b, n, h, d, generator=g) for _ in range(2))
    v = torch.randn(b, n, h, e or d, generator=g)
    log_gates = gates(g, (b, n, h))
    mask = None
    if padding:
        mask = torch.rand(b, n, generator=g) < 0.3
        mask[:, 0] = False  # every query sees a real key
    gate_dtype = torch.promote_types(dtype, torch.float32)  # bf16 inputs: float32 gates
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)] + [log_gates.to(gate_dtype).requires_grad_()]
    return leaves, mask, torch.randn(b, n, h, e or d, generator=g)


def _tolerances(q, k, v, out_grad, weights, d):
    """Bounds on |flash − float64 definition| for the output and the gradients of q, k, v and the
    gates, from float32's unit roundoff and the magnitudes involved.

    Each logit is wrong by δ = u·(D·|q||k|/√D (the dot product's roundings) + FLASH_FOX_SPAN
    (the block's gate bias, rounded at that size) + 16 (exp, sums, normalisation)); the weights
    then by ≈ 2δ relatively. Output: ≤ 2δ·max|v|. With G = max|dO_m|·max|v_n| (row norms),
    dS_mn = P_mn(dP_mn − D_m) is ≤ 2G·P_mn, wrong by ≈ 4δG·P_mn: dq sums a row (Σ_n P = 1) times
    |k|/√D; dk and dv sum a column (≤ the largest column sum of P); a log gate G_u gets the dS of
    the pairs m ≥ u > n it lies between (their mass: the largest 'straddle' sum of P). Factor 4
    over all of it for the roundings not itemised.
    """
    qn, kn = (t.detach().double().norm(dim=-1).max().item() for t in (q, k))
    s = d ** -0.5
    delta = U32 * (d * s * qn * kn + flash.FLASH_FOX_SPAN + 16)
    big_g = out_grad.norm(dim=-1).max().item() * v.detach().double().norm(dim=-1).max().item()
    column = weights.sum(-2).max().item()
    # straddle_u = Σ_{m≥u} Σ_{n<u} P_mn
    before = weights.cumsum(-1)  # [..., m, u] = Σ_{n≤u} P_mn
    n = weights.shape[-1]
    straddle = max((before[..., u:, u - 1].sum(-1).max().item() for u in range(1, n)), default=0.0)
    vmax = v.detach().double().abs().max().item()
    return [4 * 2 * delta * vmax, 4 * 4 * delta * big_g * s * kn, 4 * 4 * delta * big_g * s * qn * column,
            4 * 2 * delta * out_grad.abs().max().item() * column, 4 * 4 * delta * big_g * (1 + straddle)]


def _reference_weights(q, k, gates, window, mask):
    """(B, H, L, L) attention weights of the float64 definition: its output for v = the identity."""
    b, n, h, _ = q.shape
    eye = torch.eye(n, dtype=torch.float64).expand(b, h, n, n).permute(0, 2, 1, 3)  # (B, L, H, L)
    with torch.no_grad():
        return softmax_attention_reference(q, k, eye, causal=True, window=window, key_padding_mask=mask,
                                           log_decay=gates).permute(0, 2, 1, 3)


def _check(n, *, block, window=None, **kw):
    (q, k, v, gates), mask, out_grad = _inputs(n, **kw)
    y = flash_fox_attention(q, k, v, gates, window=window, key_padding_mask=mask, block=block)
    ref = softmax_attention_reference(q, k, v, causal=True, window=window, key_padding_mask=mask,
                                      log_decay=gates)
    tols = _tolerances(q, k, v, out_grad.double(), _reference_weights(q, k, gates, window, mask), q.shape[-1])
    fast = [y, *torch.autograd.grad(y, (q, k, v, gates), out_grad.to(y.dtype))]
    slow = [ref, *torch.autograd.grad(ref, (q, k, v, gates), out_grad.double())]
    names = ["output", "dq", "dk", "dv", "dgates"]
    for name, a, b_, tol in zip(names, fast, slow, tols, strict=True):
        assert torch.isfinite(a).all(), name
        err = (a.double() - b_).abs().max().item()
        assert err <= tol, f"{name}: {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("n,block", [(37, 8), (100, 32), (129, 64), (50, 256)])
@pytest.mark.parametrize("window", [None, 5, 40])
def test_equals_the_float64_definition_at_ragged_lengths_and_windows(n, block, window):
    """Lengths not a multiple of the block (and one block longer than L); windows inside a block,
    across blocks; B = 2, H = 3, D = 8."""
    _check(n, block=block, window=window)


@pytest.mark.parametrize("case", [dict(n=100, block=32, window=40), dict(n=77, block=16, e=12, padding=True)])
def test_the_recomputing_backward_equals_the_definition_too(case, monkeypatch):
    """Without the CPU kernel's operators (other devices, other PyTorch builds) backward recomputes
    each block through scaled_dot_product_attention: the same agreement, and a second backward of
    a kept graph takes that path too."""
    monkeypatch.setattr(flash, "_fused_cpu", lambda q: None)
    _check(case.pop("n"), **case)
    monkeypatch.undo()
    (q, k, v, gates), _, out_grad = _inputs(40)
    y = flash_fox_attention(q, k, v, gates, block=16)
    first = torch.autograd.grad(y, (q, k, v, gates), out_grad, retain_graph=True)
    again = torch.autograd.grad(y, (q, k, v, gates), out_grad)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-5) for a, b in zip(first, again, strict=True))


@pytest.mark.parametrize("case", [
    dict(n=100, scale=4.0, d=16),  # sharp logits: |q|, |k| ≈ 16, logits of ±64 nats
    dict(n=150, gates=_near_zero),  # gates near 0: every key of the past weighs
    dict(n=200, gates=_minus_50, b=1, h=2, block=256),  # near −∞: −50 per token, sums of −10,000 nats
    dict(n=1200, gates=_strong, b=1, h=2),  # −9,000 nats on head 0, long memories on head 1
    dict(n=77, e=12, padding=True),  # key padding; values wider than q and k
    dict(n=90, d=16, e=4, padding=True, seed=3),  # values narrower
], ids=["sharp", "near-0", "minus-50", "strong-1200", "padding-wide-v", "padding-narrow-v"])
def test_equals_the_float64_definition_at_extreme_gates_logits_and_padding(case):
    _check(case.pop("n"), **{"block": 64, **case})


@pytest.mark.slow
def test_default_blocks_at_a_long_length():
    """L = 2,100 (8 blocks of 256 and a ragged one), D = 32: −9,000 nats on head 0 (its blocks
    cut short by the span), long memories on head 1."""
    _check(2100, block=None, gates=_strong, b=1, h=2, d=32)


def test_blocks_end_where_the_gates_drop_by_more_than_the_span():
    """The bias of a block's own keys is rounded at its size, half the block's drop of c: a
    block's queries never span a drop larger than 2 × FLASH_FOX_SPAN nats (here 1 + 1,024 / 50
    tokens of −50 at most), and mild gates keep the full block."""
    c = torch.cumsum(torch.full((1, 100, 2), -50.0, dtype=torch.float64), 1)
    spans = flash._spans(c, 64, None)
    assert all(e - s <= 2 * flash.FLASH_FOX_SPAN / 50 + 1 for s, e, _ in spans) and spans[-1][1] == 100
    assert max(e - s for s, e, _ in spans) > flash.FLASH_FOX_SPAN / 50 + 1  # the middle as reference
    c = torch.cumsum(torch.full((1, 100, 2), -0.1, dtype=torch.float64), 1)
    assert flash._spans(c, 64, 10) == [(0, 64, 0), (64, 100, 55)]


def test_bfloat16_inputs_accumulate_in_float32():
    """bf16 q, k, v: output and gradients within bf16's rounding of the float64 definition of the
    same (rounded) inputs; a float32 accumulation; the dtypes kept."""
    (q, k, v, gates), _, out_grad = _inputs(150, dtype=torch.bfloat16, seed=4)
    y = flash_fox_attention(q, k, v, gates, block=32)
    assert y.dtype == torch.bfloat16
    exact = [t.detach().double().requires_grad_() for t in (q, k, v, gates)]
    ref = softmax_attention_reference(*exact[:3], causal=True, log_decay=exact[3])
    grads = torch.autograd.grad(y, (q, k, v, gates), out_grad.bfloat16())
    refs = torch.autograd.grad(ref, exact, out_grad.bfloat16().double())
    assert [t.dtype for t in grads] == [torch.bfloat16] * 3 + [torch.float32]
    tols = _tolerances(q, k, v, out_grad.bfloat16().double(), _reference_weights(q, k, gates, None, None), 8)
    # the result rounded to bfloat16 once (U16 of its size) on top of float32's error
    for a, b_, tol in zip([y, *grads], [ref, *refs], tols, strict=True):
        assert (a.double() - b_).abs().max().item() <= tol + U16 * b_.abs().max().item()


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operation returns and the peak of those alive (bytes)."""

    def __init__(self):
        super().__init__()
        self.largest = self.alive = self.peak = 0
        self.storages = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                self.largest = max(self.largest, t.numel())
                storage = t.untyped_storage()
                if storage.data_ptr() not in self.storages:  # views and no-op casts share one
                    self.storages.add(storage.data_ptr())
                    self.alive += storage.nbytes()
                    self.peak = max(self.peak, self.alive)
                    weakref.finalize(storage, self._freed, storage.data_ptr(), storage.nbytes())
        return out

    def _freed(self, pointer, size):
        self.storages.discard(pointer)
        self.alive -= size


def _memory(n, block=32):
    (q, k, v, gates), _, out_grad = _inputs(n, b=1, h=2, d=8)
    saved = {}  # the storages forward keeps for backward (views of one counted once)

    def keep(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with _LargestTensor() as record:
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            y = flash_fox_attention(q, k, v, gates, block=block)
        torch.autograd.grad(y, (q, k, v, gates), out_grad)
    return record, sum(saved.values())


def test_no_tensor_of_size_l_by_l_in_forward_or_backward():
    """L = 1,024 in blocks of 32: no operation returns more than a block's (Q, L) mask or the
    widened keys (B, L, H, D + 1 rounded to 8) — L² = 1,048,576 elements — and what forward
    keeps for backward, and the peak of what is alive, grow linearly with L."""
    n = 1024
    record, saved = _memory(n)
    assert record.largest <= max(32 * n, 2 * n * 16), record.largest
    record2, saved2 = _memory(2 * n)
    # q, k, v, the output and the gates (the blocks' log-sum-exps, (B, H, L), are kept beside them)
    assert saved2 <= 2 * saved and saved <= 4 * n * 2 * 8 * 4 + n * 2 * 4
    assert record2.peak <= 2.5 * record.peak, (record.peak, record2.peak)


def test_no_positions_give_an_empty_output():
    q = torch.zeros(2, 0, 3, 4, requires_grad=True)
    y = flash_fox_attention(q, q, torch.zeros(2, 0, 3, 5), torch.zeros(2, 0, 3))
    assert y.shape == (2, 0, 3, 5)
    y.sum().backward()
    assert q.grad.shape == q.shape


@pytest.mark.parametrize("bad,match", [
    (dict(block=0), "block must be a positive int"),
    (dict(window=0), "window"),
    (dict(key_padding_mask=torch.zeros(2, 5, dtype=torch.bool)), r"key_padding_mask.*\(2, 9\)"),
    (dict(v=torch.zeros(2, 8, 3, 4)), r"v \(2, 8, 3, 4\)"),
    (dict(log_decay=torch.zeros(2, 9, 4)), r"log_decay.*\(2, 9, 4\)"),
])
def test_refuses_bad_arguments_naming_them(bad, match):
    args = dict(q=torch.zeros(2, 9, 3, 4), k=torch.zeros(2, 9, 3, 4), v=torch.zeros(2, 9, 3, 4),
                log_decay=torch.zeros(2, 9, 3))
    args.update({key: bad.pop(key) for key in list(bad) if key in args})
    with pytest.raises(ValueError, match=match):
        flash_fox_attention(args["q"], args["k"], args["v"], args["log_decay"], **bad)


def test_softmax_attention_takes_the_flash_form_from_the_threshold_on(monkeypatch):
    """softmax_attention with a gate: below FLASH_FOX_MIN_LENGTH the one-bias form (gate_bias
    formed), from it on the flash form (no bias formed); both equal the float64 definition."""
    formed = []
    gate_bias = chunk.gate_bias
    monkeypatch.setattr(chunk, "gate_bias", lambda *a, **kw: formed.append(1) or gate_bias(*a, **kw))
    for n in (chunk.FLASH_FOX_MIN_LENGTH - 1, chunk.FLASH_FOX_MIN_LENGTH):
        formed.clear()
        (q, k, v, gates), _, _ = _inputs(n, dtype=torch.float64, seed=n)
        y = softmax_attention(q, k, v, causal=True, window=50, log_decay=gates)
        ref = softmax_attention_reference(q, k, v, causal=True, window=50, log_decay=gates)
        assert torch.allclose(y, ref, atol=1e-12, rtol=0)
        assert bool(formed) == (n < chunk.FLASH_FOX_MIN_LENGTH)


def _fox_layer(window=None):
    torch.manual_seed(0)
    layer = spe.MultiHeadAttention(32, 4, attention="softmax", decay="gated", window=window).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # gates that differ by position and head (at first they are RetNet's constants)
        gates = [m for m in layer.modules() if isinstance(m, ScalarGate)]
        for gate in gates:
            gate.weight.copy_(torch.randn(gate.weight.shape, generator=g, dtype=torch.float64))
    assert gates
    return layer


@pytest.mark.parametrize("window", [None, 9])
def test_the_layer_gives_the_same_output_and_gradients_on_both_paths(window, monkeypatch):
    """Through spe.MultiHeadAttention (FoX: softmax + gated decay), the flash form (threshold 1,
    blocks of 8) and the one-bias form (threshold above L) agree forward and backward, and
    decoding step by step equals the parallel pass."""
    monkeypatch.setattr(flash, "FLASH_FOX_BLOCK", 8)
    layer = _fox_layer(window)
    x = torch.randn(2, 30, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    results = []
    for threshold in (1, 10**9):
        monkeypatch.setattr(chunk, "FLASH_FOX_MIN_LENGTH", threshold)
        layer.zero_grad()
        y = layer(x)
        y.square().sum().backward()
        results.append((y.detach(), [p.grad.clone() for p in layer.parameters()]))
    (y1, g1), (y2, g2) = results
    assert torch.allclose(y1, y2, atol=1e-12, rtol=0)
    assert all(torch.allclose(a, b, atol=1e-10, rtol=0) for a, b in zip(g1, g2, strict=True))
    monkeypatch.setattr(chunk, "FLASH_FOX_MIN_LENGTH", 1)
    state, steps = None, []
    with torch.no_grad():
        for t in range(30):
            out, state = layer.step(x[:, t:t + 1], None, state)
            steps.append(out)
    assert torch.allclose(torch.cat(steps, 1), y1, atol=1e-10, rtol=0)
    assert not math.isnan(y1.sum().item())

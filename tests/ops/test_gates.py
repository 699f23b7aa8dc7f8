"""Data-dependent gates (GLA, Mamba2, FoX): every chunked/recurrent form against the explicit
O(L²) float64 sums, forward and backward (gradients w.r.t. q, k, v and the gates); recurrent ==
parallel; chunked continuation == one call; a constant gate == the (H,) decay; equal channels ==
the scalar gate; the convention (the gate of step t decays the state carried from t − 1);
causality; strong gates over long sequences in float32; validation."""

import math

import pytest
import torch

from spe.ops import (
    KVCache,
    RecentKeys,
    causal_linear_attention,
    causal_linear_attention_with_state,
    elu_feature_map,
    linear_attention,
    linear_attention_step,
    prefill_cache,
    softmax_attention,
    softmax_attention_step,
)
from spe.ops.decay import decay_attention_reference
from spe.ops.softmax.naive import gated_softmax_reference

F64 = torch.float64
B, H, M, E = 2, 3, 4, 5
TOL64 = 1e-11  # float64 sums of O(L) terms with factors ≤ 1: a few hundred roundings of 2⁻⁵³
KINDS = {"head": lambda b, n: (b, n, H), "channel": lambda b, n: (b, n, H, M)}
# (kind, normaliser, key scales): a channel gate refuses key scales
FORMS = [("head", False, False), ("head", True, False), ("head", False, True), ("head", True, True),
         ("channel", False, False), ("channel", True, False)]
FORM_IDS = ["head", "head-rope", "head-scales", "head-both", "channel", "channel-rope"]


def _inputs(n, seed=0, *, kind="head", normalizer=False, scaled=False, batch=B, spread=2.0):
    """φ(q), φ(k), v, the gates G ∈ [−spread, 0) (all requiring grad) and the keyword arguments
    (normaliser features; key log scales spread over ±30 nats)."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, n, H)
    fq, fk = (elu_feature_map(torch.randn(*shape, M, generator=g, dtype=F64)) for _ in range(2))
    v = torch.randn(*shape, E, generator=g, dtype=F64)
    gates = -spread * torch.rand(KINDS[kind](batch, n), generator=g, dtype=F64)
    extra = {}
    if normalizer:  # RoPE's form: signed numerator features, positive normaliser features
        fq, fk = (torch.randn(*shape, M, generator=g, dtype=F64) for _ in range(2))
        extra["normalizer"] = tuple(elu_feature_map(torch.randn(*shape, M, generator=g, dtype=F64)).requires_grad_()
                                    for _ in range(2))
    if scaled:
        extra["key_log_scale"] = 30 * torch.randn(*shape, generator=g, dtype=F64)
    return [t.requires_grad_() for t in (fq, fk, v, gates)], extra


def _grads(out, tensors, seed=1):
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(out.shape, generator=g, dtype=out.dtype)
    return torch.autograd.grad((out * weights).sum(), tensors, allow_unused=True, retain_graph=True)


def _check_twins(fast, slow, tensors, tol=TOL64):
    assert torch.allclose(fast, slow, atol=tol, rtol=0), (fast - slow).abs().max()
    for a, b in zip(_grads(fast, tensors), _grads(slow, tensors), strict=True):
        assert torch.allclose(a, b, atol=tol, rtol=0), (a - b).abs().max()


def _at(extra, sl):
    return {k: tuple(t[:, sl] for t in x) if isinstance(x, tuple) else x[:, sl] for k, x in extra.items()}


@pytest.mark.parametrize("kind,normalizer,scaled", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("window", [None, 1, 5, 100])
@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_causal_chunked_matches_reference(kind, normalizer, scaled, window, chunk):
    """Chunked (whole past; windows cutting chunks, spanning whole chunks, past L) == the explicit
    Σ_n exp(Σ_{n<t≤m} G_t)… in float64, forward and backward (q, k, v, G, normaliser), L not a
    multiple of C."""
    (fq, fk, v, gates), extra = _inputs(37, kind=kind, normalizer=normalizer, scaled=scaled)
    fast = causal_linear_attention(fq, fk, v, chunk_size=chunk, window=window, log_decay=gates, **extra)
    slow = decay_attention_reference(fq, fk, v, gates, causal=True, window=window, **extra)
    _check_twins(fast, slow, [fq, fk, v, gates, *extra.get("normalizer", ())])


@pytest.mark.parametrize("kind,normalizer,scaled", FORMS[::2] + FORMS[1:2], ids=FORM_IDS[::2] + FORM_IDS[1:2])
@pytest.mark.parametrize("chunk", [1, 8, 64])
def test_bidirectional_matches_reference_with_padding(kind, normalizer, scaled, chunk):
    """Encoders: key n weighs exp(Σ_{min(m,n)<t≤max(m,n)} G_t) (forward pass + shifted backward
    pass, the diagonal once) == the explicit sum, padding on the right of one example and on the
    left of the other, forward and backward."""
    (fq, fk, v, gates), extra = _inputs(29, seed=2, kind=kind, normalizer=normalizer, scaled=scaled)
    mask = torch.zeros(B, 29, dtype=torch.bool)
    mask[0, -6:], mask[1, :4] = True, True
    fast = linear_attention(fq, fk, v, chunk_size=chunk, log_decay=gates, key_padding_mask=mask, **extra)
    slow = decay_attention_reference(fq, fk, v, gates, causal=False, key_padding_mask=mask, **extra)
    _check_twins(fast, slow, [fq, fk, v, gates, *extra.get("normalizer", ())])


def _stepwise(fq, fk, v, gates, extra, window, state=None, start=0):
    outs = []
    for t in range(start, fq.shape[1]):
        y, state = linear_attention_step(fq[:, t:t + 1], fk[:, t:t + 1], v[:, t:t + 1], state, window=window,
                                         log_decay=gates[:, t:t + 1], **_at(extra, slice(t, t + 1)))
        outs.append(y)
    return torch.cat(outs, dim=1), state


def _absolute(state):
    """The state's sums in absolute scale (S, z), or its kept keys and gates."""
    if isinstance(state, RecentKeys):
        return state.keys, state.values, state.log_gates
    scale = torch.exp(state.log_scale) if hasattr(state, "log_scale") else torch.ones(state.kv.shape[:2], dtype=F64)
    return state.kv * scale[..., None, None], state.normalizer * scale[..., None]


@pytest.mark.parametrize("kind,normalizer,scaled", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("window", [None, 6])
def test_recurrent_equals_parallel(kind, normalizer, scaled, window):
    """S_t = e^{G_t} S_{t−1} + φ(k_t) v_tᵀ step by step (the windowed state re-weighing its kept
    keys by their gates) == the chunked form: outputs, final state, gradients (q, k, v, G)."""
    (fq, fk, v, gates), extra = _inputs(23, seed=3, kind=kind, normalizer=normalizer, scaled=scaled)
    if scaled:
        extra["key_log_scale"] = extra["key_log_scale"] / 10  # absolute-scale sums stay in float64 range
    fast, fast_state = causal_linear_attention_with_state(fq, fk, v, chunk_size=5, window=window, log_decay=gates,
                                                          **extra)
    slow, slow_state = _stepwise(fq, fk, v, gates, extra, window)
    _check_twins(fast, slow, [fq, fk, v, gates])
    assert type(fast_state) is type(slow_state) and fast_state.position == slow_state.position == 23
    for a, b in zip(_absolute(fast_state), _absolute(slow_state), strict=True):
        assert torch.allclose(a, b, atol=1e-9, rtol=1e-11)


@pytest.mark.parametrize("kind,normalizer,scaled", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("window", [None, 6])
def test_continuation_equals_one_call(kind, normalizer, scaled, window):
    """A chunked call's final state continued by a second chunked call, or by steps, == one call
    over the whole sequence, forward and backward (the gates' gradients cross the state)."""
    (fq, fk, v, gates), extra = _inputs(30, seed=4, kind=kind, normalizer=normalizer, scaled=scaled)
    whole = causal_linear_attention(fq, fk, v, chunk_size=4, window=window, log_decay=gates, **extra)
    first, rest = slice(0, 13), slice(13, None)
    y1, s1 = causal_linear_attention_with_state(fq[:, first], fk[:, first], v[:, first], chunk_size=4, window=window,
                                                log_decay=gates[:, first], **_at(extra, first))
    y2, _ = causal_linear_attention_with_state(fq[:, rest], fk[:, rest], v[:, rest], chunk_size=4, window=window,
                                               log_decay=gates[:, rest], initial_state=s1, **_at(extra, rest))
    y3, _ = _stepwise(fq, fk, v, gates, extra, window, state=s1, start=13)
    _check_twins(torch.cat([y1, y2], 1), whole, [fq, fk, v, gates])
    assert torch.allclose(torch.cat([y1, y3], 1), whole, atol=TOL64, rtol=0)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("scaled", [False, True])
def test_a_constant_gate_is_the_decay(window, scaled):
    """G_t = λ_h at every position == the (H,) decay path, causal (chunked and steps) and
    bidirectional; the gate's gradient summed over (B, L) == λ's."""
    (fq, fk, v, _), extra = _inputs(26, seed=5, scaled=scaled)
    lam = torch.log(torch.tensor([0.5, 0.9, 0.999], dtype=F64)).requires_grad_()
    filled = lam.detach().expand(B, 26, H).clone().requires_grad_()
    y_decay = causal_linear_attention(fq, fk, v, chunk_size=4, window=window, log_decay=lam, **extra)
    y_gate = causal_linear_attention(fq, fk, v, chunk_size=4, window=window, log_decay=filled, **extra)
    assert torch.allclose(y_gate, y_decay, atol=1e-12, rtol=0)
    (g_lam,), (g_filled,) = _grads(y_decay, [lam]), _grads(y_gate, [filled])
    assert torch.allclose(g_filled.sum(dim=(0, 1)), g_lam, atol=1e-10, rtol=0)
    steps, _ = _stepwise(fq, fk, v, filled, extra, window)
    assert torch.allclose(steps, y_decay, atol=1e-12, rtol=0)
    if window is None:
        bi_decay = linear_attention(fq, fk, v, chunk_size=4, log_decay=lam, **extra)
        bi_gate = linear_attention(fq, fk, v, chunk_size=4, log_decay=filled, **extra)
        assert torch.allclose(bi_gate, bi_decay, atol=1e-12, rtol=0)


@pytest.mark.parametrize("window", [None, 5])
def test_equal_channels_are_the_scalar_gate(window):
    """A channel gate (B, L, H, M) whose M channels are equal == the gate per head (B, L, H),
    chunked, stepped and bidirectional; its gradient summed over channels == the scalar's."""
    (fq, fk, v, gates), _ = _inputs(27, seed=6)
    channels = gates.detach()[..., None].expand(B, 27, H, M).clone().requires_grad_()
    y_head = causal_linear_attention(fq, fk, v, chunk_size=8, window=window, log_decay=gates)
    y_chan = causal_linear_attention(fq, fk, v, chunk_size=8, window=window, log_decay=channels)
    assert torch.allclose(y_chan, y_head, atol=1e-12, rtol=0)
    (g_head,), (g_chan,) = _grads(y_head, [gates]), _grads(y_chan, [channels])
    assert torch.allclose(g_chan.sum(-1), g_head, atol=1e-10, rtol=0)
    assert torch.allclose(_stepwise(fq, fk, v, channels, {}, window)[0], y_head, atol=1e-12, rtol=0)
    if window is None:
        assert torch.allclose(linear_attention(fq, fk, v, log_decay=channels), linear_attention(fq, fk, v, log_decay=gates),
                              atol=1e-12, rtol=0)


def _weights(fq, fk, gates, *, causal):
    """The attention weights as outputs: one-hot values, y_m = (weight of each key n)."""
    n = fq.shape[1]
    eye = torch.eye(n, dtype=F64)[None, :, None, :].expand(fq.shape[0], n, fq.shape[2], n)
    if causal:
        return causal_linear_attention(fq, fk, eye, chunk_size=4, log_decay=gates)
    return linear_attention(fq, fk, eye, chunk_size=4, log_decay=gates)


@pytest.mark.parametrize("kind", ["head", "channel"])
def test_the_gate_of_step_t_decays_the_state_carried_from_t_minus_1(kind):
    """With equal keys, key n − 1 weighs e^{G_n} times key n at any query m ≥ n (so the
    diagonal key weighs 1 and G_0 never counts); a gate applied to the current key would give
    e^{G_{n−1}}, a flipped sum e^{−G_n}. Encoders: key n + 1 weighs e^{G_{n+1}} times key n
    at any query m ≤ n."""
    n = 12
    ones = torch.ones(1, n, H, M, dtype=F64)
    gates = -torch.rand(KINDS[kind](1, n), generator=torch.Generator().manual_seed(7), dtype=F64)
    g = gates if kind == "head" else gates[..., 0]
    if kind == "channel":  # equal keys over one channel only: that channel's gate
        ones[..., 1:] = 0.0
    w = _weights(ones, ones.clone(), gates, causal=True)[0]  # (L_query, H, L_key)
    for m in (5, n - 1):
        ratio = w[m, :, :m] / w[m, :, 1:m + 1]  # keys n − 1 over keys n, n = 1 … m
        assert torch.allclose(ratio, torch.exp(g[0, 1:m + 1]).T, atol=1e-13, rtol=0)
    w_bi = _weights(ones, ones.clone(), gates, causal=False)[0]
    ratio = w_bi[3, :, 4:] / w_bi[3, :, 3:-1]  # key n + 1 over key n, n = 3 … L − 2
    assert torch.allclose(ratio, torch.exp(g[0, 4:]).T, atol=1e-13, rtol=0)


@pytest.mark.parametrize("kind,normalizer,scaled", FORMS[::2], ids=FORM_IDS[::2])
@pytest.mark.parametrize("window", [None, 7])
def test_causality(kind, normalizer, scaled, window):
    """Outputs before m are bit-identical when every key, value, scale and gate from m on changes."""
    (fq, fk, v, gates), extra = _inputs(40, seed=8, kind=kind, normalizer=normalizer, scaled=scaled)
    y = causal_linear_attention(fq, fk, v, chunk_size=8, window=window, log_decay=gates, **extra)
    g = torch.Generator().manual_seed(9)
    m = 21
    changed = [t.detach().clone() for t in (fq, fk, v, gates)]
    for t in changed[:3]:
        t[:, m:] = elu_feature_map(torch.randn(t[:, m:].shape, generator=g, dtype=F64))
    changed[3][:, m:] = -30 * torch.rand(changed[3][:, m:].shape, generator=g, dtype=F64)
    extra2 = dict(extra)
    if scaled:
        extra2["key_log_scale"] = extra["key_log_scale"].clone()
        extra2["key_log_scale"][:, m:] += 50.0  # a huge later key must not reach back either
    y2 = causal_linear_attention(*changed[:3], chunk_size=8, window=window, log_decay=changed[3], **extra2)
    assert torch.equal(y[:, :m], y2[:, :m])
    assert not torch.equal(y[:, m:], y2[:, m:])


def _strong_gates(shape, seed):
    """Gates of −8 … 0 with −30 (e^{−30}) every 7th position on head 0 (its sum over 1,200
    positions ≈ −9,000 nats), long memories (≥ −0.02) on head 1."""
    g = torch.Generator().manual_seed(seed)
    gates = -8 * torch.rand(shape, generator=g, dtype=F64)
    gates[:, ::7, 0] = -30.0
    gates[:, :, 1] = -0.02 * torch.rand(gates[:, :, 1].shape, generator=g, dtype=F64)
    return gates


def _float32_tolerance(length, chunk, spread, values):
    """Forward error bound of the float32 chunked form against exact sums: each output is a
    ratio of two sums of non-negative terms, each term through ≈ M (dot product) + C (chunk
    sum) + 3 log₂(L/C) (doubling merges, reads) roundings, its gate sum exponentiated with a
    relative error of C + log₂(L/C) roundings (sums of terms of one sign) times |Σ G| e^{Σ G}
    ≤ 1/e, and key scales of size ≤ spread nats rounded relatively; numerator and normaliser
    both, hence the factor 2."""
    u = 2.0 ** -24
    merges = math.log2(max(2, length // chunk))
    steps = M + chunk + 3 * merges + (chunk + merges) / math.e + 4 * (spread + 1)
    return 2 * steps * u * values


@pytest.mark.parametrize("kind,scaled,causal", [("head", False, True), ("head", True, True),
                                                ("channel", False, True), ("head", False, False)],
                         ids=["head", "head-scales", "channel", "bidirectional"])
@pytest.mark.slow
def test_strong_gates_over_a_long_sequence(kind, scaled, causal):
    """L = 1,200 with e^{−30} gates and gate sums reaching −9,000 nats (the exponential of any
    running sum underflows): the float64 kernel == the float64 reference, and float32 is
    finite and within the derived roundoff of it."""
    n, chunk = 1200, 64
    g = torch.Generator().manual_seed(10)
    fq, fk = (elu_feature_map(torch.randn(1, n, 2, M, generator=g, dtype=F64)) for _ in range(2))
    v = torch.randn(1, n, 2, E, generator=g, dtype=F64)
    gates = _strong_gates((1, n, 2) if kind == "head" else (1, n, 2, M), 11)
    extra = {"key_log_scale": 10 * torch.randn(1, n, 2, generator=g, dtype=F64)} if scaled else {}
    kernel = causal_linear_attention if causal else linear_attention
    y64 = kernel(fq, fk, v, chunk_size=chunk, log_decay=gates, **extra)
    y32 = kernel(fq.float(), fk.float(), v.float(), chunk_size=chunk, log_decay=gates.float(),
                 **{k: x.float() for k, x in extra.items()})
    ref = decay_attention_reference(fq, fk, v, gates, causal=causal, **extra)
    assert torch.allclose(y64, ref, atol=1e-10, rtol=0)  # the reference's F_m − F_n: ≈ 10⁴ · 2⁻⁵³ each
    assert torch.isfinite(y32).all()
    tol = _float32_tolerance(n, chunk if kind == "head" else 16, 4 * 10.0 if scaled else 0.0, v.abs().max().item())
    assert (y32.double() - ref).abs().max() < (2 if not causal else 1) * tol


@pytest.mark.slow
def test_strong_gates_gradients_match_the_reference():
    """Gradients (q, k, v, G) with e^{−30} gates and sums of −2,000 nats, float64, against the
    explicit sum: finite and equal (weights below 10⁻³⁰⁸ are 0 in both)."""
    (fq, fk, v, _), extra = _inputs(300, seed=12, batch=1, scaled=True)
    gates = _strong_gates((1, 300, H), 13).requires_grad_()
    fast = causal_linear_attention(fq, fk, v, chunk_size=32, log_decay=gates, **extra)
    slow = decay_attention_reference(fq, fk, v, gates, causal=True, **extra)
    _check_twins(fast, slow, [fq, fk, v, gates], tol=1e-10)


@pytest.mark.parametrize("window", [None, 4])
def test_fox_matches_reference_and_steps(window):
    """FoX: softmax(q·k/√D + Σ_{n<t≤m} G_t) == its float64 reference, forward and backward;
    the decoding steps (each cached key's log decay kept by adding gates), from scratch or from a
    prefill, equal the parallel pass, gradients included."""
    g = torch.Generator().manual_seed(14)
    q, k, v = (torch.randn(B, 13, H, 4, generator=g, dtype=F64, requires_grad=True) for _ in range(3))
    gates = (-2 * torch.rand(B, 13, H, generator=g, dtype=F64)).requires_grad_()
    y = softmax_attention(q, k, v, causal=True, window=window, log_decay=gates)
    _check_twins(y, gated_softmax_reference(q, k, v, gates, window=window), [q, k, v, gates], tol=1e-12)
    cache, outs = None, []
    for t in range(13):
        out, cache = softmax_attention_step(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], cache, window=window,
                                            log_decay=gates[:, t:t + 1])
        outs.append(out)
    _check_twins(torch.cat(outs, 1), y, [q, k, v, gates], tol=1e-12)
    assert isinstance(cache, KVCache) and cache.key_log_decay.shape == cache.keys.shape[:3]
    cache = prefill_cache(k[:, :6], v[:, :6], window=window, log_decay=gates[:, :6])
    for t in range(6, 13):
        out, cache = softmax_attention_step(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], cache, window=window,
                                            log_decay=gates[:, t:t + 1])
        assert torch.allclose(out, y[:, t:t + 1], atol=1e-12, rtol=0)


@pytest.mark.parametrize("window", [None, 3, 8, 20, 100])
def test_fox_in_query_blocks_matches_reference_and_forms_one_block_of_bias_at_a_time(window, monkeypatch):
    """Beyond FOX_QUERY_BLOCK queries FoX's bias is formed per block of queries (keys before the
    block: the block's gates from its start + the keys' gates up to it) and recomputed in
    backward: == the float64 reference forward and backward, for windows shorter than a block,
    spanning blocks and past L; no bias ever holds more than one block of rows, nor keys beyond
    what the block's queries reach."""
    import spe.ops.softmax.chunk as softmax

    monkeypatch.setattr(softmax, "FOX_QUERY_BLOCK", 8)
    shapes, attend = [], softmax.attend

    def recording(q, k, v, mask, **kw):
        shapes.append(tuple(mask.shape))
        return attend(q, k, v, mask, **kw)

    monkeypatch.setattr(softmax, "attend", recording)
    g = torch.Generator().manual_seed(16)
    q, k, v = (torch.randn(B, 37, H, 4, generator=g, dtype=F64, requires_grad=True) for _ in range(3))
    gates = (-2 * torch.rand(B, 37, H, generator=g, dtype=F64)).requires_grad_()
    y = softmax_attention(q, k, v, causal=True, window=window, log_decay=gates)
    _check_twins(y, gated_softmax_reference(q, k, v, gates, window=window), [q, k, v, gates], tol=1e-12)
    reach = 37 if window is None else 8 + window - 1
    assert len(shapes) >= 2 * 5 and all(rows <= 8 and keys <= min(reach, 37) for _, _, rows, keys in shapes)


def test_fox_strong_gates_and_float32():
    """FoX with gate sums of −9,000 nats over L = 1,200: float32 finite and within roundoff of the
    float64 reference (logit terms are segment sums, never differences of running sums), and a
    constant gate (H,) equals the filled (B, L, H) one."""
    n = 1200
    g = torch.Generator().manual_seed(15)
    q, k, v = (torch.randn(1, n, 2, 8, generator=g, dtype=F64) for _ in range(3))
    gates = _strong_gates((1, n, 2), 16)
    y32 = softmax_attention(q.float(), k.float(), v.float(), causal=True, log_decay=gates.float())
    ref = gated_softmax_reference(q, k, v, gates)
    # each logit: a dot product (D roundings) and a segment sum (≤ L roundings of terms of one sign,
    # times its size: the weights it leaves ≥ e^{−|x|} carry x·u relative error, ≤ u/e · L overall)
    tol = 2 * (8 + n / math.e + 8) * 2.0 ** -24 * v.abs().max().item()
    assert torch.isfinite(y32).all() and (y32.double() - ref).abs().max() < tol
    lam = torch.log(torch.tensor([0.5, 0.99], dtype=F64))
    assert torch.allclose(softmax_attention(q[:, :50], k[:, :50], v[:, :50], causal=True, log_decay=lam),
                          gated_softmax_reference(q[:, :50], k[:, :50], v[:, :50], lam.expand(1, 50, 2)),
                          atol=1e-12, rtol=0)


def test_validation_names_what_was_received_and_what_is_allowed():
    (fq, fk, v, gates), _ = _inputs(8)
    with pytest.raises(ValueError, match=r"\(B, L, H\) = \(2, 8, 3\) or \(B, L, H, M\) = \(2, 8, 3, 4\), got "
                                         r"torch.float64 \(2, 8\)"):
        causal_linear_attention(fq, fk, v, log_decay=gates[..., 0])
    with pytest.raises(ValueError, match=r"got torch.int64 \(2, 8, 3\)"):
        causal_linear_attention(fq, fk, v, log_decay=torch.zeros(B, 8, H, dtype=torch.long))
    bad = gates.detach().clone()
    bad[1, 5, 2] = 0.25  # a gate given as a factor or a logit, not its log
    with pytest.raises(ValueError, match=r"≤ 0, got 0.25 at index \(1, 5, 2\)"):
        causal_linear_attention(fq, fk, v, log_decay=bad)
    bad[1, 5, 2] = -math.inf
    with pytest.raises(ValueError, match="finite"):
        linear_attention_step(fq[:, 5:6], fk[:, 5:6], v[:, 5:6], log_decay=bad[:, 5:6])
    channel = torch.zeros(B, 8, H, M, dtype=F64)
    with pytest.raises(ValueError, match="does not combine with key_log_scale"):
        causal_linear_attention(fq, fk, v, log_decay=channel, key_log_scale=torch.zeros(B, 8, H, dtype=F64))
    with pytest.raises(ValueError, match="M' = 6"):
        causal_linear_attention(fq, fk, v, log_decay=channel, normalizer=(torch.rand(B, 8, H, 6),) * 2)
    with pytest.raises(ValueError, match=r"\(H,\) = \(3,\) or \(B, L, H\) = \(2, 8, 3\), got"):
        softmax_attention(fq, fk, v, causal=True, log_decay=channel)  # no channel gate on logits
    with pytest.raises(ValueError, match="causal attention"):
        softmax_attention(fq, fk, v, causal=False, log_decay=gates)


def test_states_of_another_gate_form_are_refused():
    """A windowed state keeps its positions' gates: a gated call refuses one without them and an
    ungated call one with them; a FoX cache likewise (old caches work without a gate)."""
    (fq, fk, v, gates), _ = _inputs(8)
    _, plain = causal_linear_attention_with_state(fq, fk, v, window=4)
    _, gated = causal_linear_attention_with_state(fq, fk, v, window=4, log_decay=gates)
    assert gated.log_gates.shape == (B, 4, H, 1)
    with pytest.raises(ValueError, match="holds no gate for its kept keys, this call has gates with 1 channel"):
        causal_linear_attention(fq, fk, v, window=4, log_decay=gates, initial_state=plain)
    with pytest.raises(ValueError, match="holds gates with 1 channel"):
        linear_attention_step(fq[:, :1], fk[:, :1], v[:, :1], gated, window=4)
    with pytest.raises(ValueError, match="gates with 4 channel"):
        causal_linear_attention(fq, fk, v, window=4, initial_state=gated, log_decay=gates.detach()[..., None].expand(
            B, 8, H, M))
    old = KVCache(keys=fk[:, :3], values=v[:, :3], position=3)
    out, cache = softmax_attention_step(fq[:, 3:4], fk[:, 3:4], v[:, 3:4], old)
    assert cache.key_log_decay is None and out.shape == (B, 1, H, E)
    with pytest.raises(ValueError, match="built with no gate"):
        softmax_attention_step(fq[:, 3:4], fk[:, 3:4], v[:, 3:4], old, log_decay=gates[:, 3:4])
    with pytest.raises(ValueError, match="inconsistent KVCache"):
        KVCache(keys=fk[:, :3], values=v[:, :3], position=3, key_log_decay=torch.zeros(B, 2, H))
    with pytest.raises(ValueError, match="inconsistent RecentKeys"):  # neither 1 nor M = 4 gate channels
        RecentKeys(keys=fk[:, :3], values=v[:, :3], window=4, position=3, log_gates=torch.zeros(B, 3, H, 3))



def test_the_factored_channel_gate_and_its_exact_rows_match_the_reference():
    """A channel gate over keys without log scales factors its in-chunk weights; a query whose
    chunk's gates up to it sum below −FACTOR_EXPONENT_LIMIT nats in some channel takes the exact
    form. Both kinds of row in one call (head 0: gates of −9 … −6, so rows past the 8th of a
    chunk of 16 are exact; heads 1, 2: moderate), forward and backward against the float64
    explicit sum; and the causality of both to the bit when later gates flip rows to exact."""
    from spe.ops.decay.gated import FACTOR_EXPONENT_LIMIT

    (fq, fk, v, _), _ = _inputs(48, seed=21, kind="channel")
    g = torch.Generator().manual_seed(22)
    gates = -0.5 * torch.rand(B, 48, H, M, generator=g, dtype=F64)
    gates[:, :, 0] = -6.0 - 3.0 * torch.rand(B, 48, M, generator=g, dtype=F64)
    gates.requires_grad_()
    within = -torch.cumsum(gates.detach().reshape(B, 3, 16, H, M), dim=2).amax(-1)  # rows' largest exponent
    assert (within > FACTOR_EXPONENT_LIMIT).any() and (within <= FACTOR_EXPONENT_LIMIT).any()
    fast = causal_linear_attention(fq, fk, v, chunk_size=16, log_decay=gates)
    slow = decay_attention_reference(fq, fk, v, gates, causal=True)
    _check_twins(fast, slow, [fq, fk, v, gates], tol=1e-10)
    later = gates.detach().clone()
    later[:, 20:, 1:] = -40.0  # rows from 20 on become exact in every head
    again = causal_linear_attention(fq, fk, v, chunk_size=16, log_decay=later)
    assert torch.equal(fast[:, :20], again[:, :20])


@pytest.mark.parametrize("chunk", [40, 64])
def test_channel_gate_rows_past_the_limit_take_sub_chunks_and_match_the_reference(chunk, monkeypatch):
    """Chunks longer than a sub-chunk (CHANNEL_CHUNK), 40 not a multiple of it: rows past
    −FACTOR_EXPONENT_LIMIT take the sub-chunk form, in which keys of earlier sub-chunks reach
    the query through e^{F_j − F_e} · e^{F_e − F_d}. One channel of head 0 forgets fast (−6 to
    −9 nats a step, making most of its rows exact) while its other channels keep keys for
    hundreds of steps, so earlier sub-chunks weigh in; forward and backward against the float64
    sum, the float32 path without overflow, and the sub-chunk form is what ran."""
    import spe.ops.decay.gated as gated

    calls = []
    original = gated._sub_chunk_sums
    monkeypatch.setattr(gated, "_sub_chunk_sums", lambda *a: calls.append(a[0].shape) or original(*a))
    (fq, fk, v, _), _ = _inputs(150, seed=26, kind="channel")
    g = torch.Generator().manual_seed(27)
    gates = -0.5 * torch.rand(B, 150, H, M, generator=g, dtype=F64)
    gates[:, :, 0, 1:] = -0.02 * torch.rand(B, 150, M - 1, generator=g, dtype=F64)
    gates[:, :, 0, 0] = -6.0 - 3.0 * torch.rand(B, 150, generator=g, dtype=F64)
    gates.requires_grad_()
    fast = causal_linear_attention(fq, fk, v, chunk_size=chunk, log_decay=gates)
    slow = decay_attention_reference(fq, fk, v, gates, causal=True)
    _check_twins(fast, slow, [fq, fk, v, gates], tol=1e-10)
    assert calls and all(shape[2] == chunk for shape in calls)
    # float32: the fast channel's sums reach −360 nats in a chunk, far past e^{±88}; every
    # factor the form builds stays ≤ 1 (padding included), so nothing overflows into 0 · ∞
    fast32 = causal_linear_attention(*(t.detach().float() for t in (fq, fk, v)), chunk_size=chunk,
                                     log_decay=gates.detach().float())
    scale = slow.detach().abs().max()
    assert torch.isfinite(fast32).all()
    assert (fast32.double() - slow.detach()).abs().max() <= 1e-5 * scale  # 150 terms, each within 2⁻²⁴


def _refuse_in_chunk_segment_sums(monkeypatch):
    """Fail on any segment sums of the gates inside a chunk (dim 2 or 3: the exact (C, C, M)
    weights, of a chunk or of a sub-chunk); those across chunks (dim 1, the product that sums
    earlier chunks) are kept."""
    import spe.ops.decay.gated as gated

    original = gated.segment_sums

    def refuse(g, dim):
        if dim != 1:
            raise AssertionError("the exact (C, C, M) weights were formed")
        return original(g, dim)

    monkeypatch.setattr(gated, "segment_sums", refuse)


def test_moderate_channel_gates_never_form_the_exact_weights(monkeypatch):
    """The point of the factored form: a language model's channel gates (GLA's logsigmoid / 16,
    a few nats per chunk) never build the (C, C, M) weights."""
    _refuse_in_chunk_segment_sums(monkeypatch)
    (fq, fk, v, gates), _ = _inputs(64, seed=23, kind="channel", spread=2.0)
    y = causal_linear_attention(fq, fk, v, chunk_size=16, log_decay=gates)
    torch.testing.assert_close(y, decay_attention_reference(fq, fk, v, gates, causal=True), atol=1e-10, rtol=0)


def test_an_encoder_channel_gate_with_padding_never_forms_the_exact_weights(monkeypatch):
    """Encoders too: the backward pass's key beyond the end and padding keys sit at the floor
    scale (weight exactly 0), which must not push the channel gate to its (C, C, M) form."""
    (fq, fk, v, gates), _ = _inputs(45, seed=24, kind="channel", spread=2.0)
    mask = torch.zeros(B, 45, dtype=torch.bool)
    mask[0, -6:], mask[1, :4] = True, True
    slow = decay_attention_reference(fq, fk, v, gates, causal=False, key_padding_mask=mask)
    _refuse_in_chunk_segment_sums(monkeypatch)
    fast = linear_attention(fq, fk, v, chunk_size=16, log_decay=gates, key_padding_mask=mask)
    _check_twins(fast, slow, [fq, fk, v, gates], tol=1e-10)


@pytest.mark.parametrize("kind,scaled,constant", [("head", True, "SCALAR_PRODUCT_CHUNKS"),
                                                  ("channel", False, "CHANNEL_PRODUCT_CHUNKS")],
                         ids=["scalar", "channel"])
@pytest.mark.parametrize("limit", [2, 512])
def test_gates_sum_earlier_chunks_by_product_or_doubling_alike(limit, kind, scaled, constant, monkeypatch):
    """A gate over the whole past sums the chunks before each chunk by one product with (N, N)
    chunk weights (per channel for a channel gate) up to its limit of chunks and by doubling
    beyond: both == the float64 reference forward and backward (L = 37 in chunks of 4: 11
    chunks with the empty one after; the scalar gate with key scales over ±30 nats, the
    channel gate with gates from 0 to −2 nats a step, drawn per channel), and the product
    is what the default takes."""
    import spe.ops.decay.gated as gated

    assert getattr(gated, constant) >= 11  # the default takes the product at this length
    monkeypatch.setattr(gated, constant, limit)
    used = []
    for name in ("_chunks_before", "_chunks_before_product"):
        original = getattr(gated, name)
        monkeypatch.setattr(gated, name, lambda *a, _f=original, _n=name: used.append(_n) or _f(*a))
    (fq, fk, v, gates), extra = _inputs(37, seed=25, kind=kind, scaled=scaled)
    fast = causal_linear_attention(fq, fk, v, chunk_size=4, log_decay=gates, **extra)
    _check_twins(fast, decay_attention_reference(fq, fk, v, gates, causal=True, **extra), [fq, fk, v, gates])
    assert set(used) == {"_chunks_before" if limit == 2 else "_chunks_before_product"}


def test_encoder_scalar_chunk_is_the_cost_minimising_power_of_two():
    """An encoder's scalar-gate passes cost ∝ L·C·(M + E) (exact in-chunk weights) + (L/C)²·M·E
    (the chunks before each chunk): the chosen C is the cheapest power of two in [16, chunk_size]
    under that model, never above the caller's C, and ListOps' cpu-small shape gets 16."""
    from spe.ops.decay.gated import MIN_ENCODER_CHUNK, encoder_scalar_chunk

    def cost(n, m, e, c):
        return n * c * (m + e) + (n / c) ** 2 * m * e

    for n, m, e in [(170, 32, 17), (1000, 64, 65), (4096, 64, 64), (16384, 256, 1), (29, 4, 6)]:
        chosen = encoder_scalar_chunk(n, m, e, 1024)
        powers = [2 ** p for p in range(4, 11)]
        assert chosen in powers
        assert cost(n, m, e, chosen) <= 1.0001 * min(cost(n, m, e, c) for c in powers if c >= MIN_ENCODER_CHUNK)
    assert encoder_scalar_chunk(170, 32, 17, 64) == 16
    assert encoder_scalar_chunk(4096, 64, 64, 64) == 64  # ∛(2·4096·32) ≈ 64
    assert encoder_scalar_chunk(100_000, 64, 64, 64) == 64  # the caller's C bounds it
    assert encoder_scalar_chunk(170, 32, 17, 8) == 8  # a smaller caller's C is kept


@pytest.mark.parametrize("normalizer", [False, True], ids=["ones", "normaliser"])
def test_encoder_scalar_gate_takes_one_cost_chunk_for_numerator_and_normaliser(monkeypatch, normalizer):
    """linear_attention with a scalar gate runs its passes at encoder_scalar_chunk's C, the same
    for the numerator and the normaliser (their references then match to the bit), and equals the
    float64 sum; with one chunk (L ≤ C) too."""
    import spe.ops.linear_attn.chunk as linear_module
    from spe.ops.decay.gated import encoder_scalar_chunk

    seen = []
    original = linear_module.gated_bidirectional_sums

    def spy(*args):
        seen.append(args[-1])
        return original(*args)

    monkeypatch.setattr(linear_module, "gated_bidirectional_sums", spy)
    for n in (12, 300):
        seen.clear()
        (fq, fk, v, gates), extra = _inputs(n, seed=5, normalizer=normalizer, scaled=True)
        fast = linear_attention(fq, fk, v, chunk_size=64, log_decay=gates, **extra)
        value_dim = E + (not normalizer)
        assert seen == [encoder_scalar_chunk(n, M, value_dim, 64)] * (1 + normalizer)
        slow = decay_attention_reference(fq, fk, v, gates, causal=False, **extra)
        _check_twins(fast, slow, [fq, fk, v, gates, *extra.get("normalizer", ())])
    seen.clear()  # at 3,000 positions the per-call C would differ (32 for the values, 16 for the ones)
    (fq, fk, v, gates), extra = _inputs(3000, seed=5, normalizer=normalizer, scaled=True)
    with torch.no_grad():
        linear_attention(fq, fk, v, chunk_size=64, log_decay=gates, **extra)
    assert seen == [32] * (1 + normalizer) and encoder_scalar_chunk(3000, M, 1, 64) == 16

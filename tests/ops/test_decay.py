"""Decay on the lag (RetNet): every chunked/scanned form against the explicit O(L²) float64 sum
(forward and backward, gradients w.r.t. q, k, v and log γ), recurrent == parallel (outputs,
final states, gradients), causality, the relative property, long sequences in float32, and
the encoder's padding invariance."""

import math

import pytest
import torch

from spe.ops import (
    causal_linear_attention,
    causal_linear_attention_with_state,
    elu_feature_map,
    linear_attention,
    linear_attention_step,
)
from spe.ops.decay import check_log_decay, decay_attention_reference, decayed_running_max, retnet_log_decay

F64 = torch.float64
# γ = 0.5, 0.9, 0.999: a short, a medium and a long memory, one per head
LOG_DECAY = torch.log(torch.tensor([0.5, 0.9, 0.999], dtype=F64))
# float64 sums of O(L) terms with factors ≤ 1: a few hundred roundings of 2⁻⁵³ each
TOL64 = 1e-11


def _inputs(n, seed=0, *, normalizer=False, scaled=False, batch=2):
    """φ(q), φ(k), v, log γ (all requiring grad) and the keyword arguments (normaliser
    features, key log scales spread over ±30 nats)."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, n, 3)
    fq = elu_feature_map(torch.randn(*shape, 4, generator=g, dtype=F64))
    fk = elu_feature_map(torch.randn(*shape, 4, generator=g, dtype=F64))
    v = torch.randn(*shape, 5, generator=g, dtype=F64)
    extra = {}
    if normalizer:  # RoPE's form: signed numerator features, positive normaliser features
        fq, fk = (torch.randn(*shape, 4, generator=g, dtype=F64) for _ in range(2))
        extra["normalizer"] = tuple(elu_feature_map(torch.randn(*shape, 6, generator=g, dtype=F64)).requires_grad_()
                                    for _ in range(2))
    if scaled:
        extra["key_log_scale"] = 30 * torch.randn(*shape, generator=g, dtype=F64)
    lam = LOG_DECAY.clone().requires_grad_()
    return [t.requires_grad_() for t in (fq, fk, v)] + [lam], extra


def _grads(out, tensors, seed=1):
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(out.shape, generator=g, dtype=out.dtype)
    return torch.autograd.grad((out * weights).sum(), tensors, allow_unused=True)


def _check_twins(fast, slow, tensors, tol=TOL64):
    assert torch.allclose(fast, slow, atol=tol, rtol=0), (fast - slow).abs().max()
    for a, b in zip(_grads(fast, tensors), _grads(slow, tensors), strict=True):
        assert torch.allclose(a, b, atol=tol, rtol=0), (a - b).abs().max()


FORMS = [dict(), dict(normalizer=True), dict(scaled=True), dict(normalizer=True, scaled=True)]


@pytest.mark.parametrize("form", FORMS, ids=["plain", "rope-normaliser", "key-scales", "both"])
@pytest.mark.parametrize("window", [None, 1, 5, 16, 100])
@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_causal_chunked_matches_reference(form, window, chunk):
    """Chunked (whole past and every window case: cut chunks, whole chunks by doubling, a window
    past L) == Σ_{m−W<n≤m} γ^{m−n}… in float64, forward and backward, with L not a multiple of C."""
    (fq, fk, v, lam), extra = _inputs(37, **form)
    fast = causal_linear_attention(fq, fk, v, chunk_size=chunk, window=window, log_decay=lam, **extra)
    slow = decay_attention_reference(fq, fk, v, lam, causal=True, window=window, **extra)
    _check_twins(fast, slow, [fq, fk, v, lam, *extra.get("normalizer", ())])


@pytest.mark.parametrize("form", FORMS, ids=["plain", "rope-normaliser", "key-scales", "both"])
@pytest.mark.parametrize("chunk", [1, 8, 64])
def test_bidirectional_matches_reference_with_padding(form, chunk):
    """Encoder form γ^{|m−n|} (forward + shifted backward scan, the diagonal once) == the explicit
    sum, with padding on the right of one example and on the left of the other."""
    (fq, fk, v, lam), extra = _inputs(29, seed=2, **form)
    mask = torch.zeros(2, 29, dtype=torch.bool)
    mask[0, -6:], mask[1, :4] = True, True
    fast = linear_attention(fq, fk, v, chunk_size=chunk, log_decay=lam, key_padding_mask=mask, **extra)
    slow = decay_attention_reference(fq, fk, v, lam, causal=False, key_padding_mask=mask, **extra)
    _check_twins(fast, slow, [fq, fk, v, lam, *extra.get("normalizer", ())])


def _stepwise(fq, fk, v, lam, extra, window, state=None, start=0):
    outs = []
    for t in range(start, fq.shape[1]):
        one = {}
        if "normalizer" in extra:
            one["normalizer"] = tuple(x[:, t:t + 1] for x in extra["normalizer"])
        if "key_log_scale" in extra:
            one["key_log_scale"] = extra["key_log_scale"][:, t:t + 1]
        y, state = linear_attention_step(fq[:, t:t + 1], fk[:, t:t + 1], v[:, t:t + 1], state, window=window,
                                         log_decay=lam, **one)
        outs.append(y)
    return torch.cat(outs, dim=1), state


def _sums(state):
    """The state's sums in absolute scale (S, z), or its kept keys."""
    if hasattr(state, "kv"):
        scale = torch.exp(state.log_scale)[..., None] if hasattr(state, "log_scale") else 1.0
        return state.kv * scale[..., None] if hasattr(state, "log_scale") else state.kv, state.normalizer * scale
    return state.keys, state.values


@pytest.mark.parametrize("form", FORMS, ids=["plain", "rope-normaliser", "key-scales", "both"])
@pytest.mark.parametrize("window", [None, 6])
def test_recurrent_equals_parallel(form, window):
    """S_m = γ S_{m−1} + φ(k_m) v_mᵀ (and the windowed γ^{lag} sums) step by step == the chunked
    form: outputs, final state and gradients (q, k, v, log γ)."""
    (fq, fk, v, lam), extra = _inputs(23, seed=3, **form)
    if "key_log_scale" in extra:
        extra["key_log_scale"] = extra["key_log_scale"] / 10  # absolute-scale sums stay in float64 range
    fast, fast_state = causal_linear_attention_with_state(fq, fk, v, chunk_size=5, window=window, log_decay=lam,
                                                          **extra)
    slow, slow_state = _stepwise(fq, fk, v, lam, extra, window)
    _check_twins(fast, slow, [fq, fk, v, lam])
    assert type(fast_state) is type(slow_state) and fast_state.position == slow_state.position == 23
    for a, b in zip(_sums(fast_state), _sums(slow_state), strict=True):
        assert torch.allclose(a, b, atol=1e-9, rtol=1e-11)


@pytest.mark.parametrize("form", FORMS, ids=["plain", "rope-normaliser", "key-scales", "both"])
@pytest.mark.parametrize("window", [None, 6])
def test_prefill_then_continue(form, window):
    """A chunked prefill's state continued by another chunked call and by steps == one pass."""
    (fq, fk, v, lam), extra = _inputs(30, seed=4, **form)
    whole = decay_attention_reference(fq, fk, v, lam, causal=True, window=window, **extra)

    def part(sl):
        return {k: tuple(t[:, sl] for t in x) if isinstance(x, tuple) else x[:, sl] for k, x in extra.items()}

    y1, s1 = causal_linear_attention_with_state(fq[:, :13], fk[:, :13], v[:, :13], chunk_size=4, window=window,
                                                log_decay=lam, **part(slice(0, 13)))
    y2, _ = causal_linear_attention_with_state(fq[:, 13:], fk[:, 13:], v[:, 13:], chunk_size=4, window=window,
                                               log_decay=lam, initial_state=s1, **part(slice(13, None)))
    y3, _ = _stepwise(fq, fk, v, lam, extra, window, state=s1, start=13)
    assert torch.allclose(torch.cat([y1, y2], 1), whole, atol=TOL64, rtol=0)
    assert torch.allclose(torch.cat([y1, y3], 1), whole, atol=TOL64, rtol=0)


@pytest.mark.parametrize("form", FORMS[::2], ids=["plain", "key-scales"])
@pytest.mark.parametrize("window", [None, 7])
def test_causality(form, window):
    """Outputs before m are bit-identical when every token from m on changes."""
    (fq, fk, v, lam), extra = _inputs(40, seed=5, **form)
    y = causal_linear_attention(fq, fk, v, chunk_size=8, window=window, log_decay=lam, **extra)
    g = torch.Generator().manual_seed(9)
    m = 21
    changed = [t.detach().clone() for t in (fq, fk, v)]
    for t in changed:
        t[:, m:] = elu_feature_map(torch.randn(t[:, m:].shape, generator=g, dtype=F64))
    extra2 = dict(extra)
    if "key_log_scale" in extra:
        extra2["key_log_scale"] = extra["key_log_scale"].clone()
        extra2["key_log_scale"][:, m:] += 50.0  # a huge later key must not reach back either
    y2 = causal_linear_attention(*changed, chunk_size=8, window=window, log_decay=lam, **extra2)
    assert torch.equal(y[:, :m], y2[:, :m])
    assert not torch.equal(y[:, m:], y2[:, m:])


def _weights(fq, fk, lam, *, causal):
    """The attention weights as outputs: one-hot values, y_m = (weight of each key n)."""
    n = fq.shape[1]
    eye = torch.eye(n, dtype=F64)[None, :, None, :].expand(fq.shape[0], n, fq.shape[2], n)
    if causal:
        return causal_linear_attention(fq, fk, eye, chunk_size=8, log_decay=lam)
    return linear_attention(fq, fk, eye, chunk_size=8, log_decay=lam)


@pytest.mark.parametrize("causal", [True, False])
def test_relative_property(causal):
    """Identical content shifted by s positions (empty keys before and after it) gives the same
    weights between m and n: they depend on m − n and content only, never on the position."""
    (fq, fk, _, lam), _ = _inputs(20, seed=6)
    fq, fk, lam = fq.detach(), fk.detach(), lam.detach()
    s, after = 13, 5

    def shifted(t):
        return torch.cat([torch.zeros_like(t[:, :s]), t, torch.zeros_like(t[:, :after])], dim=1)

    w = _weights(fq, fk, lam, causal=causal)
    w_shifted = _weights(shifted(fq), shifted(fk), lam, causal=causal)[:, s:s + 20, :, s:s + 20]
    assert torch.allclose(w, w_shifted, atol=TOL64, rtol=0)
    assert w_shifted.sum(-1).sub(1).abs().max() < TOL64  # the empty keys take no weight


def test_decay_weights_are_gamma_powers():
    """With equal keys, the weight ratio between keys n and n − 1 of query m is γ exactly."""
    fq = torch.ones(1, 12, 3, 2, dtype=F64)
    w = _weights(fq, fq.clone(), LOG_DECAY, causal=True)[0, -1]  # (H, L): query 11
    ratio = w[:, :-1] / w[:, 1:]
    assert torch.allclose(ratio, torch.exp(LOG_DECAY)[:, None].expand_as(ratio), atol=1e-13, rtol=0)


def _float32_tolerance(length, chunk, features, spread, values):
    """Forward error bound of the float32 chunked form: each output is a convex combination
    (ratio of two sums of non-negative terms), each term through ≈ M (dot product) + C (chunk
    sum) + 3 log₂(L/C) (scan merges, reads) roundings, plus exp arguments of size ≤ spread
    nats rounded relatively; numerator and normaliser both, hence the factor 2."""
    u = 2.0 ** -24
    steps = features + chunk + 3 * math.log2(max(2, length // chunk)) + 4 * (spread + 1)
    return 2 * steps * u * values


@pytest.mark.parametrize("gamma", [0.5, 1 - 2 ** -20])
@pytest.mark.parametrize("scaled", [False, True])
def test_long_sequence_float32(gamma, scaled):
    """L = 4096 in float32 against float64 (γ = 0.5: powers far below float32's range; γ within
    2⁻²⁰ of 1): finite, no underflow to an empty normaliser, within the derived roundoff."""
    n, chunk = 4096, 64
    g = torch.Generator().manual_seed(7)
    fq = elu_feature_map(torch.randn(1, n, 2, 4, generator=g, dtype=F64))
    fk = elu_feature_map(torch.randn(1, n, 2, 4, generator=g, dtype=F64))
    v = torch.randn(1, n, 2, 4, generator=g, dtype=F64)
    lam = torch.log1p(torch.tensor([-(1 - gamma)] * 2, dtype=F64)).float()
    extra = {"key_log_scale": 10 * torch.randn(1, n, 2, generator=g, dtype=F64)} if scaled else {}
    y32 = causal_linear_attention(fq.float(), fk.float(), v.float(), chunk_size=chunk, log_decay=lam,
                                  **{k: x.float() for k, x in extra.items()})
    y64 = causal_linear_attention(fq, fk, v, chunk_size=chunk, log_decay=lam.double(), **extra)
    assert torch.isfinite(y32).all()
    spread = 4 * 10.0 if scaled else 0.0
    tol = _float32_tolerance(n, chunk, 4, spread, v.abs().max().item())
    assert (y32.double() - y64).abs().max() < tol
    y_bi = linear_attention(fq.float(), fk.float(), v.float(), chunk_size=chunk, log_decay=lam,
                            **{k: x.float() for k, x in extra.items()})
    y_bi64 = linear_attention(fq, fk, v, chunk_size=chunk, log_decay=lam.double(), **extra)
    assert torch.isfinite(y_bi).all() and (y_bi.double() - y_bi64).abs().max() < 2 * tol


@pytest.mark.slow
def test_long_sequence_float64_matches_reference():
    """The float64 chunked form at L = 1024 (≫ C) against the explicit sum, γ = 0.5 and ≈ 1."""
    (fq, fk, v, _), extra = _inputs(1024, seed=8, scaled=True, batch=1)
    lam = torch.log1p(torch.tensor([-0.5, -2.0 ** -20, -0.1], dtype=F64))
    fast = causal_linear_attention(fq, fk, v, chunk_size=32, log_decay=lam, **extra)
    slow = decay_attention_reference(fq, fk, v, lam, causal=True, **extra)
    assert torch.allclose(fast, slow, atol=1e-10, rtol=0)


@pytest.mark.parametrize("left", [0, 9])
def test_encoder_padding_invariance(left):
    """Padding keys (masked) anywhere add nothing: real positions' outputs equal the unpadded
    sequence's, padding on the right and on the left (lags between real positions hold)."""
    (fq, fk, v, lam), extra = _inputs(25, seed=10, scaled=True, batch=1)
    y = linear_attention(fq, fk, v, chunk_size=8, log_decay=lam, **extra)
    g = torch.Generator().manual_seed(11)

    def padded(t, right=7):
        junk = lambda k: 100 * torch.rand(t.shape[0], k, *t.shape[2:], generator=g, dtype=F64)  # noqa: E731
        return torch.cat([junk(left), t, junk(right)], dim=1)

    mask = torch.zeros(1, left + 25 + 7, dtype=torch.bool)
    mask[:, :left], mask[:, left + 25:] = True, True
    yp = linear_attention(padded(fq), padded(fk), padded(v), chunk_size=8, log_decay=lam,
                          key_log_scale=padded(extra["key_log_scale"]), key_padding_mask=mask)
    assert torch.allclose(yp[:, left:left + 25], y, atol=TOL64, rtol=0)


def test_decayed_running_max_is_the_recursion():
    """Doubling gives c_m = max(c_{m−1} + λ, a_m) exactly as the step does, from a previous scale."""
    g = torch.Generator().manual_seed(12)
    a, prev = 5 * torch.randn(2, 37, 3, generator=g, dtype=F64), torch.randn(2, 3, generator=g, dtype=F64)
    c, expect = decayed_running_max(a, LOG_DECAY, prev), []
    run = prev
    for t in range(37):
        run = torch.maximum(run + LOG_DECAY, a[:, t])
        expect.append(run)
    assert torch.allclose(c, torch.stack(expect, 1), atol=1e-12, rtol=0)


def test_retnet_values_and_validation():
    """RetNet's γ_h = 1 − 2^(−5−h); log γ must be a finite (H,) tensor ≤ 0."""
    assert torch.allclose(torch.exp(retnet_log_decay(4, dtype=F64)),
                          1 - torch.tensor([2.0 ** -5, 2.0 ** -6, 2.0 ** -7, 2.0 ** -8], dtype=F64))
    with pytest.raises(ValueError, match=r"\(3,\) tensor"):
        check_log_decay(torch.zeros(4), 3)
    with pytest.raises(ValueError, match="≤ 0"):
        check_log_decay(torch.tensor([0.5, -0.1, -0.2]), 3)  # γ given instead of log γ
    with pytest.raises(ValueError, match="finite"):
        check_log_decay(torch.tensor([-math.inf, -0.1, -0.2]), 3)
    (fq, fk, v, _), _ = _inputs(8)
    with pytest.raises(ValueError, match="as many queries as keys"):
        linear_attention(fq[:, :5], fk, v, log_decay=LOG_DECAY)

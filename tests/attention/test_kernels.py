"""The kernel registry: every kernel's parallel function equals an explicit float64 reference,
its step function equals the parallel one position by position (outputs and final states, with
windows, RoPE and FAVOR+ key scales), outputs are causal, what a spec refuses is refused, and the
layer reaches kernels only through the registry."""

import ast
import dataclasses
import math
from pathlib import Path

import pytest
import torch

from spe.attention import kernels as kernel_module
from spe.attention.kernels import KERNELS, FeatureTransform, KernelOptions, kernel_features, kernel_spec
from spe.attention.layer import ACCEPTS, ATTENTIONS
from spe.encodings import ALiBi, RotaryEncoding
from spe.ops import KVCache, causal_linear_attention_with_state, orthogonal_random_features

ROPE = FeatureTransform(RotaryEncoding(), numerator_only=True, name="rotary encoding")
B, L, H, E, M = 2, 11, 2, 4, 8


def _inputs(spec, seed=0):
    """q, k, v (float64) with key norms spread over ×1 … ×4, so that FAVOR+ key log scales
    differ by tens of nats, and the kernel's projection (if it draws one)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, L, H, E, generator=g, dtype=torch.float64) for _ in range(3))
    k = k * torch.linspace(1, 4, L, dtype=torch.float64)[None, :, None, None]
    projection = orthogonal_random_features(H, M, E, generator=g).double() if spec.random_features else None
    return q, k, v, projection


def _transforms(spec):
    """No transform, and RoPE wherever the kernel takes it (else the refusal is the documented one)."""
    try:
        spec.check(KernelOptions(), transform=ROPE)
    except ValueError as e:
        assert "strictly positive" in str(e) and not spec.positive_features
        return [None]
    return [None, ROPE]


CASES = [(name, t) for name, spec in KERNELS.items() for t in _transforms(spec)]


def _allowed(lq, lk, causal, window, mask):
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        allowed = (i - j >= 0) & (i - j < (window or lq + lk))
    allowed = allowed[None, None]  # (1, 1, Lq, Lk)
    return allowed if mask is None else allowed & ~mask[:, None, None, :]


def _reference(spec, f, v, *, causal, window=None, mask=None):
    """Explicit attention from the features: softmax of q·k/√E, or Σ w v / Σ w with
    w_mn = φ(q_m)·φ(k_n) e^{a_n − max a} (numerator) and ψ(q_m)·ψ(k_n) e^{a_n − max a} (normaliser),
    0 where the normaliser is 0 (:func:`spe.ops.normalise`); Σ w v alone for a normaliser-free kernel."""
    allowed = _allowed(f.q.shape[1], f.k.shape[1], causal, window, mask)
    if spec.feature_map is None:
        scores = torch.einsum("bmhe,bnhe->bhmn", f.q, f.k) / math.sqrt(f.q.shape[-1])
        return torch.einsum("bhmn,bnhe->bmhe", scores.masked_fill(~allowed, -math.inf).softmax(-1), v)
    scale = 1.0
    if f.key_log_scale is not None:
        a = f.key_log_scale
        scale = torch.exp(a - a.amax(dim=1, keepdim=True)).permute(0, 2, 1)[:, :, None, :]  # (B, H, 1, Lk)
    nq, nk = f.normalizer or (f.q, f.k)
    num = (torch.einsum("bmhf,bnhf->bhmn", f.q, f.k) * scale).masked_fill(~allowed, 0.0)
    if spec.normalizer_free:
        return torch.einsum("bhmn,bnhe->bmhe", num, v)
    den = (torch.einsum("bmhf,bnhf->bhmn", nq, nk) * scale).masked_fill(~allowed, 0.0)
    den = den.sum(-1).transpose(1, 2)[..., None]  # (B, Lq, H, 1); 0 where no key has weight (ReLU): output 0
    return torch.einsum("bhmn,bnhe->bmhe", num, v) / den.where(den != 0, 1.0)


def _features(spec, q, k, projection, transform, positions):
    return kernel_features(spec, q, k, projection=projection, transform=transform, positions=positions)


@pytest.mark.parametrize("name,transform", CASES)
@pytest.mark.parametrize("causal,window,padded", [(True, None, False), (True, 3, False), (True, 5, False),
                                                  (False, None, False), (False, None, True)])
def test_parallel_equals_the_explicit_reference(name, transform, causal, window, padded):
    spec = kernel_spec(name)
    q, k, v, projection = _inputs(spec)
    mask = None
    if padded:
        mask = torch.zeros(B, L, dtype=torch.bool)
        mask[0, 7:] = True
    f = _features(spec, q, k, projection, transform, torch.arange(L))
    options = KernelOptions(causal=causal, window=window, chunk_size=4, key_padding_mask=mask)
    spec.check(options, transform=transform)
    y = spec.parallel(f, v, options)
    assert y.shape == (B, L, H, E) and y.dtype == torch.float64
    torch.testing.assert_close(y, _reference(spec, f, v, causal=causal, window=window, mask=mask))


def _state_tensors(state):
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}


@pytest.mark.parametrize("name,transform", CASES)
@pytest.mark.parametrize("window", [None, 1, 3, 20])
def test_steps_equal_the_parallel_kernel_with_the_same_final_state(name, transform, window):
    spec = kernel_spec(name)
    q, k, v, projection = _inputs(spec, seed=1)
    options = KernelOptions(causal=True, window=window, chunk_size=4)
    f = _features(spec, q, k, projection, transform, torch.arange(L))
    parallel = spec.parallel(f, v, options)
    state, steps = None, []
    for t in range(L):
        one = _features(spec, q[:, t:t + 1], k[:, t:t + 1], projection, transform, torch.tensor([t]))
        y, state = spec.step(one, v[:, t:t + 1], state, options)
        assert isinstance(state, spec.state_types) and state.position == t + 1 and state.window == window
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, 1), parallel)
    if isinstance(state, KVCache):  # softmax keeps the last W keys and values themselves
        kept = slice(-window, None) if window else slice(None)
        torch.testing.assert_close(state.keys, f.k[:, kept])
        torch.testing.assert_close(state.values, v[:, kept])
        return
    _, final = causal_linear_attention_with_state(f.q, f.k, v, chunk_size=4, window=window, normalizer=f.normalizer,
                                                  key_log_scale=f.key_log_scale, normalize=not spec.normalizer_free)
    assert type(final) is type(state)
    for (field, a), b in zip(_state_tensors(final).items(), _state_tensors(state).values(), strict=True):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, msg=field)
        else:
            assert a == b, field


@pytest.mark.parametrize("name,transform", CASES)
@pytest.mark.parametrize("window", [None, 3])
def test_outputs_do_not_depend_on_later_positions(name, transform, window):
    spec = kernel_spec(name)
    q, k, v, projection = _inputs(spec, seed=2)
    options = KernelOptions(causal=True, window=window, chunk_size=4)
    y = spec.parallel(_features(spec, q, k, projection, transform, torch.arange(L)), v, options)
    t = 6
    q2, k2, v2 = (torch.cat([x[:, :t], 5 * torch.randn_like(x[:, t:])], 1) for x in (q, k, v))
    y2 = spec.parallel(_features(spec, q2, k2, projection, transform, torch.arange(L)), v2, options)
    torch.testing.assert_close(y2[:, :t], y[:, :t])
    assert (y2[:, t:] - y[:, t:]).abs().max() > 1e-3  # the later ones do change


@pytest.mark.parametrize("name", list(KERNELS))
def test_each_spec_refuses_what_it_does_not_accept(name):
    spec = kernel_spec(name)
    if not spec.decay:  # softmax; the linear kernels take one (tests/ops/test_decay.py)
        with pytest.raises(ValueError, match="decay"):
            spec.check(KernelOptions(decay=torch.full((H,), -0.1)))
    else:
        spec.check(KernelOptions(decay=torch.full((H,), -0.1)))
    if not spec.score_terms:
        with pytest.raises(ValueError, match="score term"):
            spec.check(KernelOptions(score_term=ALiBi(H)))
    else:
        spec.check(KernelOptions(score_term=ALiBi(H)))
    assert spec.state_types and all(isinstance(t, type) for t in spec.state_types)
    assert set(spec.accepts) <= set(kernel_module.KERNEL_PLACES)


def test_the_layer_names_and_places_come_from_the_registry():
    assert ATTENTIONS == tuple(KERNELS) and ACCEPTS == {n: s.accepts for n, s in KERNELS.items()}
    with pytest.raises(ValueError, match="unknown attention 'flash'; choose one of softmax, performer"):
        kernel_spec("flash")


def test_the_layer_never_branches_on_a_kernel_name():
    # One path for forward and one for step: the layer reads the spec, never compares names,
    # and calls no kernel function directly.
    source = Path(kernel_module.__file__).with_name("layer.py").read_text()
    tree = ast.parse(source)
    names = set(KERNELS)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                assert not (isinstance(side, ast.Constant) and side.value in names), ast.unparse(node)
                assert not (isinstance(side, ast.Attribute) and side.attr == "attention"), ast.unparse(node)
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert not called & {"softmax_attention", "causal_linear_attention", "linear_attention", "linear_attention_step",
                         "softmax_attention_step", "append_to_cache"}

"""Linear attention kernels: chunked = cumulative sums = explicit masked form; O(N) memory."""

import subprocess
import sys

import pytest
import torch

from spe.ops import (
    causal_linear_attention,
    causal_linear_attention_reference,
    elu_feature_map,
    favor_feature_map,
    linear_attention,
    orthogonal_random_features,
)


def _explicit(phi_q, phi_k, v, causal):
    a = torch.einsum("bmhf,bnhf->bhmn", phi_q, phi_k)
    if causal:
        a = a.tril()
    return torch.einsum("bhmn,bnhe->bmhe", a, v) / a.sum(-1).transpose(1, 2)[..., None]


def _inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    phi_q = elu_feature_map(torch.randn(2, n, 3, 4, generator=g, dtype=torch.float64)).requires_grad_()
    phi_k = elu_feature_map(torch.randn(2, n, 3, 4, generator=g, dtype=torch.float64)).requires_grad_()
    v = torch.randn(2, n, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    return phi_q, phi_k, v


def _assert_same_forward_and_backward(args, fns):
    """Outputs and input gradients (of a fixed linear projection of the output) agree across fns."""
    outs = []
    for fn in fns:
        for t in args:
            t.grad = None
        y = fn(*args)
        (y * torch.linspace(-1, 1, y.numel(), dtype=torch.float64).view_as(y)).sum().backward()
        outs.append([y.detach()] + [t.grad.clone() for t in args])
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("n,chunk,group", [(1, 4, 8), (16, 4, 8), (17, 4, 8), (30, 7, 14), (30, 7, 1000), (9, 64, 64), (50, 4, 1)])
def test_chunked_equals_reference_forward_and_backward(n, chunk, group):
    _assert_same_forward_and_backward(_inputs(n), (
        lambda *a: causal_linear_attention(*a, chunk_size=chunk, group_size=group),
        causal_linear_attention_reference,
        lambda *a: _explicit(*a, causal=True)))


def _explicit_window(phi_q, phi_k, v, window):
    lag = torch.arange(phi_q.shape[1])[:, None] - torch.arange(phi_k.shape[1])[None, :]
    a = torch.einsum("bmhf,bnhf->bhmn", phi_q, phi_k) * ((lag >= 0) & (lag < window))
    return torch.einsum("bhmn,bnhe->bmhe", a, v) / a.sum(-1).transpose(1, 2)[..., None]


# windows that the chunk divides or not (prime W), shorter than a chunk, W = 1, W ≥ L, and
# (200, 68, 2): 33 whole chunks inside the window (doubling sums of 1, 32 chunks)
@pytest.mark.parametrize("n,window,chunk", [(37, 8, 4), (40, 12, 8), (70, 10, 4), (30, 1, 8), (50, 16, 64),
                                            (129, 100, 64), (20, 30, 8), (24, 24, 8), (61, 13, 4), (130, 97, 16),
                                            (45, 3, 8), (200, 68, 2)])
def test_sliding_window_equals_reference_and_explicit_forward_and_backward(n, window, chunk):
    _assert_same_forward_and_backward(_inputs(n, seed=1), (
        lambda *a: causal_linear_attention(*a, chunk_size=chunk, window=window),
        lambda *a: causal_linear_attention_reference(*a, window=window),
        lambda *a: _explicit_window(*a, window)))


def test_sliding_window_with_a_separate_normalizer_equals_reference():
    phi_q, phi_k, v = (t.detach() for t in _inputs(45, seed=2))
    nq, nk = phi_q.abs() + 0.1, phi_k.abs() + 0.1
    y = causal_linear_attention(phi_q, phi_k, v, chunk_size=8, window=20, normalizer=(nq, nk))
    lag = torch.arange(45)[:, None] - torch.arange(45)[None, :]
    band = (lag >= 0) & (lag < 20)
    num = torch.einsum("bhmn,bnhe->bmhe", torch.einsum("bmhf,bnhf->bhmn", phi_q, phi_k) * band, v)
    den = (torch.einsum("bmhf,bnhf->bhmn", nq, nk) * band).sum(-1).transpose(1, 2)[..., None]
    torch.testing.assert_close(y, num / den)
    torch.testing.assert_close(y, causal_linear_attention_reference(phi_q, phi_k, v, window=20, normalizer=(nq, nk)))


def test_sliding_window_rejects_bad_values():
    args = [t.detach() for t in _inputs(10)]
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="window"):
            causal_linear_attention(*args, window=bad)
    with pytest.raises(ValueError, match="group_size"):
        causal_linear_attention(*args, window=4, group_size=8)


def test_non_causal_equals_explicit():
    args = _inputs(11)
    torch.testing.assert_close(linear_attention(*args), _explicit(*args, causal=False))


def test_causal_output_ignores_the_future():
    phi_q, phi_k, v = (t.detach() for t in _inputs(40))
    y = causal_linear_attention(phi_q, phi_k, v, chunk_size=8)
    phi_k2, v2 = phi_k.clone(), v.clone()
    phi_k2[:, 25:] += 3.0
    v2[:, 25:] = -v2[:, 25:]
    y2 = causal_linear_attention(phi_q, phi_k2, v2, chunk_size=8)
    torch.testing.assert_close(y[:, :25], y2[:, :25])
    assert (y[:, 25:] - y2[:, 25:]).abs().max() > 1e-3


@pytest.mark.slow
def test_causal_linear_attention_never_allocates_length_squared():
    # At L = 32,768 an L × L float32 matrix alone is 4 GiB; the chunked kernel needs a few MB.
    code = (
        "import resource, torch\n"
        "from spe.ops import causal_linear_attention\n"
        "torch.set_num_threads(1)\n"
        "n = 32768\n"
        "x = torch.rand(1, n, 1, 8)\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "y = causal_linear_attention(x, x, x, chunk_size=64)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grown_mib = float(out.stdout.strip())
    assert grown_mib < 512, f"peak memory grew by {grown_mib:.0f} MiB"


def test_favor_features_are_unbiased_for_the_softmax_kernel():
    # Without stabiliser (the key form), φ(x)·φ(y) = (1/M) Σ_m exp(ω_m·(x'+y') − ‖x'‖²/2 − ‖y'‖²/2),
    # an unbiased estimate of exp(x'·y') with x' = x / E^{1/4}. For i.i.d. Gaussian ω one term has
    # variance exp(2‖x'+y'‖² − ‖x'‖² − ‖y'‖²) − exp(2 x'·y'); orthogonal rows only lower it.
    g = torch.Generator().manual_seed(0)
    e, m = 8, 4096
    proj = orthogonal_random_features(1, m, e, generator=g).double()
    x = 0.5 * torch.randn(1, 6, 1, e, generator=g, dtype=torch.float64)
    y = 0.5 * torch.randn(1, 6, 1, e, generator=g, dtype=torch.float64)
    approx = torch.einsum("blhm,bnhm->bln", favor_feature_map(x, proj, is_query=False),
                          favor_feature_map(y, proj, is_query=False))
    xs, ys = x[:, :, 0] / e**0.25, y[:, :, 0] / e**0.25
    dot = torch.einsum("ble,bne->bln", xs, ys)
    nx, ny = (xs**2).sum(-1), (ys**2).sum(-1)
    sum_sq = nx[:, :, None] + ny[:, None, :] + 2 * dot
    var = torch.exp(2 * sum_sq - nx[:, :, None] - ny[:, None, :]) - torch.exp(2 * dot)
    z = (approx - torch.exp(dot)) / torch.sqrt(var / m)
    assert z.abs().max() < 4


def test_query_stabiliser_cancels_in_each_row():
    g = torch.Generator().manual_seed(1)
    proj = orthogonal_random_features(1, 64, 8, generator=g).double()
    x = 3 * torch.randn(1, 5, 1, 8, generator=g, dtype=torch.float64)
    y = torch.randn(1, 7, 1, 8, generator=g, dtype=torch.float64)
    fy = favor_feature_map(y, proj, is_query=False)
    stab = torch.einsum("blhm,bnhm->bln", favor_feature_map(x, proj, is_query=True, eps=0.0), fy)
    raw = torch.einsum("blhm,bnhm->bln", favor_feature_map(x, proj, is_query=False), fy)
    torch.testing.assert_close(stab / stab.sum(-1, keepdim=True), raw / raw.sum(-1, keepdim=True))


def test_orthogonal_features_are_orthogonal_within_blocks():
    w = orthogonal_random_features(2, 8, 8, generator=torch.Generator().manual_seed(0))
    gram = w[0] @ w[0].T
    torch.testing.assert_close(gram - torch.diag(torch.diagonal(gram)), torch.zeros(8, 8), atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chunked_kernel_keeps_float32_state_under_low_precision_inputs(dtype):
    # Inputs rounded to low precision, then the kernel must match float32 on those same inputs,
    # at a length where summing states in 16-bit would lose several digits.
    phi_q, phi_k, v = (t.detach().to(dtype) for t in _inputs(3000, seed=3))
    y = causal_linear_attention(phi_q, phi_k, v, chunk_size=64)
    ref = causal_linear_attention_reference(phi_q.float(), phi_k.float(), v.float())
    assert y.dtype == dtype
    step = torch.finfo(dtype).eps  # one rounding of the output
    torch.testing.assert_close(y.float(), ref, atol=4 * step * ref.abs().max().item(), rtol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_auto = causal_linear_attention(phi_q.float(), phi_k.float(), v.float(), chunk_size=64)
    torch.testing.assert_close(y_auto.float(), ref, atol=1e-5, rtol=1e-5)

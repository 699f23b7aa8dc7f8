"""Relative softmax attention: skewing = explicit gather; Shaw = plain attention at zero and = a loop."""

import pytest
import torch

from spe.encodings import ALiBi, MusicRelativePosition, ShawRelativePosition, alibi_slopes
from spe.ops import (
    music_relative_attention,
    music_relative_attention_reference,
    relative_shift,
    shaw_attention,
    skew,
    softmax_attention,
)


def _qkv(n, seed=0, b=2, h=3, d=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, n, h, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13])
def test_skew_equals_explicit_gather_on_and_below_the_diagonal(n):
    g = torch.Generator().manual_seed(n)
    q = torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64)  # (B, H, L, D)
    e = torch.randn(n, 4, generator=g, dtype=torch.float64)  # r = -(L-1) … 0
    skewed = skew(q @ e.T)
    for i in range(n):
        for j in range(i + 1):
            expected = q[:, :, i] @ e[j - i + n - 1]  # q_i · e_{j-i}
            torch.testing.assert_close(skewed[:, :, i, j], expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_relative_shift_equals_explicit_gather_everywhere(n):
    g = torch.Generator().manual_seed(n)
    q = torch.randn(2, n, 4, generator=g, dtype=torch.float64)
    e = torch.randn(2 * n - 1, 4, generator=g, dtype=torch.float64)  # r = -(L-1) … L-1
    shifted = relative_shift(q @ e.T)
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    expected = torch.einsum("bid,ijd->bij", q, e[j - i + n - 1])
    torch.testing.assert_close(shifted, expected, atol=1e-12, rtol=0)


def test_skew_rejects_non_square_input():
    with pytest.raises(ValueError, match="square"):
        skew(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="2L - 1"):
        relative_shift(torch.zeros(3, 4))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [1, 6, 11])
def test_music_relative_skewing_equals_explicit_form_forward_and_backward(causal, n):
    q, k, v = _qkv(n)
    width = n if causal else 2 * n - 1
    rel = torch.randn(width, 3, 4, generator=torch.Generator().manual_seed(9), dtype=torch.float64,
                      requires_grad=True)
    fast = music_relative_attention(q, k, v, rel, causal=causal)
    ref = music_relative_attention_reference(q, k, v, rel, causal=causal)
    torch.testing.assert_close(fast, ref, atol=1e-12, rtol=0)
    grads = [torch.autograd.grad(out.square().sum(), (q, k, v, rel)) for out in (fast, ref)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=0)


def test_music_relative_without_embeddings_is_plain_attention_and_clips_far_distances():
    q, k, v = _qkv(9)
    with torch.no_grad():
        module = MusicRelativePosition(3, 4, max_distance=2).double()  # r = -2, -1, 0
        module.embeddings.zero_()
        torch.testing.assert_close(module.attend(q, k, v), softmax_attention(q, k, v, causal=True))
        module.embeddings.normal_(generator=torch.Generator().manual_seed(0))
        out = module.attend(q, k, v)
        # distances ≥ 2 all use e_{-2}: an explicit table with that clipping gives the same
        table = module.embeddings[torch.tensor([0] * 7 + [1, 2])]  # r = -8 … 0
        torch.testing.assert_close(out, music_relative_attention_reference(q, k, v, table, causal=True))
        # the same k means the same clipping for Shaw: k + 1 learned distances in both
        assert module.embeddings.shape[0] == ShawRelativePosition(4, max_distance=2).rel_keys.shape[0] == 3


def _shaw_loop(q, k, v, rel_k, rel_v, kmax, causal):
    b, lq, h, d = q.shape
    out = torch.zeros_like(q)
    for bi in range(b):
        for hi in range(h):
            for i in range(lq):
                keys = range(i + 1) if causal else range(k.shape[1])
                logits, vals = [], []
                for j in keys:
                    r = max(-kmax, min(kmax, j - i)) + kmax  # causal tables hold r = -k … 0
                    logits.append(q[bi, i, hi] @ (k[bi, j, hi] + rel_k[r]) / d**0.5)
                    vals.append(v[bi, j, hi] + rel_v[r])
                w = torch.stack(logits).softmax(0)
                out[bi, i, hi] = (w[:, None] * torch.stack(vals)).sum(0)
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_shaw_with_zero_embeddings_equals_plain_attention(causal):
    q, k, v = _qkv(7)
    module = ShawRelativePosition(4, max_distance=2, causal=causal).double()
    with torch.no_grad():
        module.rel_keys.zero_()
        module.rel_values.zero_()
        torch.testing.assert_close(module.attend(q, k, v), softmax_attention(q, k, v, causal=causal))


@pytest.mark.parametrize("causal", [True, False])
def test_shaw_with_clipping_equals_a_loop(causal):
    q, k, v = _qkv(7, b=1, h=2)
    module = ShawRelativePosition(4, max_distance=2, causal=causal).double()
    with torch.no_grad():
        module.rel_keys.normal_(generator=torch.Generator().manual_seed(1))
        module.rel_values.normal_(generator=torch.Generator().manual_seed(2))
        expected = _shaw_loop(q, k, v, module.rel_keys, module.rel_values, 2, causal)
        torch.testing.assert_close(module.attend(q, k, v), expected, atol=1e-12, rtol=0)


def test_kernels_reject_mismatched_shapes():
    q, k, v = _qkv(4)
    with pytest.raises(ValueError, match="rel_keys"):
        shaw_attention(q, k, v, torch.zeros(4, 4, 3), torch.zeros(4, 4, 4), causal=True)
    with pytest.raises(ValueError, match="rel_keys"):
        music_relative_attention_reference(q, k, v, torch.zeros(3, 3, 4), causal=True)
    with pytest.raises(ValueError, match="as many keys"):
        music_relative_attention(q, k[:, :3], v[:, :3], torch.zeros(4, 3, 4), causal=True)
    with pytest.raises(ValueError, match="batch, length, num_heads"):
        shaw_attention(q, k[..., :2], v, torch.zeros(4, 4, 4), torch.zeros(4, 4, 4), causal=True)


def test_alibi_slopes_follow_press_et_al():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -i for i in range(1, 9)]))
    # not a power of two: the 4-head sequence, then every other slope of the 8-head one
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8,
                                                              2.0 ** -1, 2.0 ** -3]))


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_equals_explicit_biased_softmax(causal):
    q, k, v = _qkv(6)
    module = ALiBi(3, causal=causal).double()
    logits = torch.einsum("bihd,bjhd->bhij", q, k) / 2.0  # √D = 2
    i, j = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    logits = logits - module.slopes[:, None, None] * (i - j).abs()
    if causal:
        logits = logits.masked_fill(j > i, float("-inf"))
    expected = torch.einsum("bhij,bjhe->bihe", logits.softmax(-1), v)
    torch.testing.assert_close(module.attend(q, k, v), expected, atol=1e-12, rtol=0)

"""Translation invariance and monotonicity (appendix D.3): known answers, ranges, probing a model."""

import math

import numpy as np
import pytest
import torch

from spe import POSITIONALS, DecoderLM, ModelConfig
from spe.lab.metrics import identical_token_attention, monotonicity, translation_invariance


def _lower(rows):
    """A square matrix from its lower-triangular rows; the upper triangle is filled with 99."""
    n = len(rows)
    a = torch.full((n, n), 99.0, dtype=torch.float64)
    for m, row in enumerate(rows):
        a[m, :m + 1] = torch.tensor(row, dtype=torch.float64)
    return a


def _toeplitz(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    by_offset = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    m, k = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    a = by_offset[(m - k).clamp(min=0)]
    # The upper triangle (negative offsets) is never read: make it anything but Toeplitz.
    return torch.where(m >= k, a, torch.rand(n, n, generator=g, dtype=torch.float64))


def test_translation_invariance_by_hand():
    # Diagonals o=0: {1, 3, 6}, o=1: {2, 5}, o=2: {4}; all six entries have mean 3.5 and
    # sum of squares 17.5; within diagonals 114/9 + 4.5 + 0 = 103/6, so T = 103/105.
    a = _lower([[1], [2, 3], [4, 5, 6]])
    assert translation_invariance(a) == pytest.approx(103 / 105, rel=1e-12)
    # Rows 1-2, offsets 0-1: {3, 6} and {2, 5}: total 10, within 4.5 + 4.5, so T = 0.9.
    assert translation_invariance(a, query_range=(1, 3), max_offset=1) == pytest.approx(0.9, rel=1e-12)


def test_toeplitz_is_exactly_translation_invariant():
    a = _toeplitz(40)
    assert translation_invariance(a) <= 1e-12
    assert translation_invariance(a, query_range=(10, 30), max_offset=7) <= 1e-12
    assert translation_invariance(a.numpy()) <= 1e-12


def test_random_matrix_is_not_translation_invariant_and_scale_does_not_matter():
    g = torch.Generator().manual_seed(0)
    a = torch.exp(torch.randn(64, 64, generator=g, dtype=torch.float64))
    t = translation_invariance(a)
    # For i.i.d. entries E[within] / E[total] = (N − O) / (N − 1) = (2080 − 64) / 2079 ≈ 0.97
    # (N entries, O diagonals); 0.8 leaves room for sampling noise of one draw.
    assert 0.8 < t <= 1.0
    assert translation_invariance(1e6 * a) == pytest.approx(t, rel=1e-12)
    assert translation_invariance(1e-6 * a) == pytest.approx(t, rel=1e-12)
    assert monotonicity(1e6 * a) == monotonicity(a)


def test_constant_matrix_scores_zero_on_both():
    a = torch.full((10, 10), 3.0)
    assert translation_invariance(a) == 0.0
    assert monotonicity(a) == 0.0  # ties are not inversions


def test_monotonicity_by_hand():
    # Row 1 by offset: [2, 3], one inverted pair of 1; row 2 by offset: [5, 6, 4], only
    # (o=0, o=1) inverted, 1 of 3 pairs; row 0 has no pair. M = 2 / 4.
    assert monotonicity(_lower([[1], [3, 2], [4, 6, 5]])) == 0.5
    assert monotonicity(_lower([[1], [2, 3], [4, 5, 6]])) == 0.0


def test_monotonicity_decreasing_increasing_and_shuffled_rows():
    n = 50
    m, k = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    offset = (m - k).to(torch.float64)
    row_scale = torch.linspace(1.0, 5.0, n, dtype=torch.float64)[:, None]  # rows differ: not Toeplitz
    decreasing = row_scale * torch.exp(-0.1 * offset)
    assert monotonicity(decreasing) == 0.0
    assert monotonicity(row_scale * torch.exp(0.1 * offset)) == 1.0
    g = torch.Generator().manual_seed(0)
    shuffled = decreasing.clone()
    for row in range(n):
        perm = torch.randperm(row + 1, generator=g)
        shuffled[row, :row + 1] = decreasing[row, :row + 1][perm]
    assert 0.0 < monotonicity(shuffled) < 1.0


def test_monotonicity_of_iid_entries_is_one_half_within_kendall_noise():
    n = 200
    a = torch.rand(n, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    # Row m has k = m + 1 keys; its inversion count is Kendall's null statistic with mean
    # k(k−1)/4 and variance k(k−1)(2k+5)/72 (the pairs of a row are dependent, so this and
    # not the binomial variance applies); rows are independent.
    k = np.arange(1, n + 1, dtype=np.float64)
    pairs = (k * (k - 1) / 2).sum()
    std = math.sqrt((k * (k - 1) * (2 * k + 5) / 72).sum()) / pairs
    assert abs(monotonicity(a) - 0.5) < 5 * std  # std ≈ 0.003


def test_only_the_selected_entries_matter():
    g = torch.Generator().manual_seed(1)
    a = torch.exp(torch.randn(30, 30, generator=g, dtype=torch.float64))
    kw = {"query_range": (8, 20), "max_offset": 5}
    t, mono = translation_invariance(a, **kw), monotonicity(a, **kw)
    b = a.clone()
    m, k = torch.meshgrid(torch.arange(30), torch.arange(30), indexing="ij")
    outside = (m < 8) | (m >= 20) | (m - k > 5) | (m - k < 0)
    b[outside] = torch.rand(int(outside.sum()), generator=g, dtype=torch.float64) * 1e3
    b[0, 29] = math.nan  # non-finite entries outside the selection are ignored too
    assert translation_invariance(b, **kw) == t
    assert monotonicity(b, **kw) == mono
    # ...and inside the selection they do matter.
    b[12, 10] *= 7.0
    assert translation_invariance(b, **kw) != t


def test_rectangular_matrix_uses_existing_keys_only():
    # 6 queries, 4 keys: row 5 with max_offset 1 would need keys 5 and 4, which do not exist.
    a = _toeplitz(6)[:, :4]
    assert translation_invariance(a) <= 1e-12
    with pytest.raises(ValueError, match="no attention entry"):
        translation_invariance(a, query_range=(5, 6), max_offset=1)


@pytest.mark.parametrize("metric", [translation_invariance, monotonicity])
def test_bad_inputs_are_clear_errors(metric):
    a = torch.rand(5, 5, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="matrix"):
        metric(torch.ones(2, 5, 5))
    with pytest.raises(ValueError, match="matrix"):
        metric(torch.ones(5))
    with pytest.raises(ValueError, match="empty"):
        metric(torch.ones(0, 5))
    for bad in [(3, 2), (0, 6), (-1, 3), (2, 2)]:
        with pytest.raises(ValueError, match="query_range"):
            metric(a, query_range=bad)
    with pytest.raises(ValueError, match="pair"):
        metric(a, query_range=(1, 2, 3))
    with pytest.raises(ValueError, match="max_offset"):
        metric(a, max_offset=-1)
    with pytest.raises(TypeError, match="max_offset"):
        metric(a, max_offset=1.5)
    nan = a.clone()
    nan[3, 1] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        metric(nan)
    with pytest.raises(TypeError):
        metric("attention")


def test_a_single_diagonal():
    a = _lower([[1], [0, 2], [0, 0, 4]])
    with pytest.raises(ValueError, match="two considered keys"):
        monotonicity(a, max_offset=0)
    # All the variance lies along one offset, so none of it is explained by the offset.
    assert translation_invariance(a, max_offset=0) == pytest.approx(1.0, rel=1e-12)


def _model(positional, num_realizations=8, **kw):
    torch.manual_seed(0)
    kw = {"attention": "performer", **kw}
    config = ModelConfig(vocab_size=20, d_model=32, num_layers=2, num_heads=2, d_ff=64, dropout=0.1,
                         positional=positional, num_realizations=num_realizations, **kw)
    return DecoderLM(config)


def test_probe_shape_mask_scale_and_mode():
    model = _model("sinespe")
    model.train()
    a = identical_token_attention(model, 3, 24, layer=1)
    assert model.training  # the caller's mode is restored
    assert a.shape == (2, 24, 24)
    assert a.dtype == torch.float64
    upper = torch.ones(24, 24, dtype=torch.bool).triu(1)
    assert (a[:, upper] == 0).all()
    assert (a[:, ~upper] > 0).all()
    torch.testing.assert_close(a.amax(dim=(1, 2)), torch.ones(2, dtype=torch.float64), rtol=0, atol=0)
    # Deterministic: eval mode draws the SPE code from config.code_seed.
    torch.testing.assert_close(identical_token_attention(model, 3, 24, layer=1), a, rtol=0, atol=0)


def test_probe_matches_queries_and_keys_recomputed_from_the_block_input():
    model = _model("ape").eval()
    block = model.blocks[0]
    seen = {}
    handle = block.norm1.register_forward_hook(lambda mod, args, out: seen.setdefault("x", out))
    with torch.no_grad():
        model(torch.full((1, 16), 5))
        handle.remove()
        q, k, _ = block.attn.qkv(seen["x"]).view(1, 16, 3, 2, 16).unbind(2)  # (1, L, H, D)
    logits = torch.einsum("mhd,nhd->hmn", q[0].double(), k[0].double()) / math.sqrt(16)
    a = identical_token_attention(model, 5, 16)
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    # log A = logits − c_h on the causal part: the difference is one constant per head.
    diff = (torch.log(a) - logits)[:, causal]
    torch.testing.assert_close(diff - diff[:, :1], torch.zeros_like(diff), rtol=0, atol=1e-5)


def test_probe_without_positional_encoding_is_translation_invariant():
    # Identical tokens and no PE: every query and every key is the same vector, so the causal
    # part is constant (float32 rounding aside) and T is 0.
    a = identical_token_attention(_model("none"), 7, 32)
    causal = torch.ones(32, 32, dtype=torch.bool).tril()
    assert float(a[:, causal].max() - a[:, causal].min()) <= 1e-6
    assert all(translation_invariance(head) <= 1e-6 for head in a)


def test_probe_of_exact_sine_spe_is_toeplitz():
    # Ungated sineSPE whose orthogonal noise has R = D·2K realisations (16 · 10 = 160) gives the
    # relative kernel exactly (Q̄ K̄ᵀ with Z Zᵀ = R·I), so on identical tokens layer 0's attention
    # depends on m − n only: T is float32 rounding (≈1e-13 observed), while a few Gaussian
    # realisations leave it clearly position-dependent.
    exact = _model("sinespe", num_realizations=160, gated=False, num_sines=5, code_noise="orthogonal")
    a = identical_token_attention(exact, 2, 48)
    assert all(translation_invariance(head) < 1e-8 for head in a)
    noisy = identical_token_attention(_model("sinespe", gated=False, num_sines=5), 2, 48)
    assert all(translation_invariance(head) > 0.05 for head in noisy)


@pytest.mark.skipif("rope" not in POSITIONALS, reason="this version has no RoPE")
def test_probe_of_rope_is_toeplitz():
    # Identical tokens give the same q and k at every position; RoPE rotates them by angles
    # proportional to the position, so q_m · k_n depends on m − n only: T is float32 rounding.
    a = identical_token_attention(_model("rope", attention="softmax"), 4, 48)
    assert all(translation_invariance(head) < 1e-8 for head in a)
    with pytest.raises(ValueError, match="RoPE"):
        identical_token_attention(_model("rope", attention="linear-elu"), 4, 8)


@pytest.mark.skipif("alibi" not in POSITIONALS, reason="this version has no score encodings")
def test_probe_refuses_score_encodings():
    with pytest.raises(ValueError, match="scores"):
        identical_token_attention(_model("alibi", attention="softmax"), 4, 8)


def test_probe_errors():
    model = _model("sinespe")
    with pytest.raises(ValueError, match="token"):
        identical_token_attention(model, 20, 8)
    with pytest.raises(ValueError, match="length"):
        identical_token_attention(model, 1, 0)
    with pytest.raises(ValueError, match="layer"):
        identical_token_attention(model, 1, 8, layer=2)
    with pytest.raises(TypeError, match="DecoderLM"):
        identical_token_attention(torch.nn.Linear(2, 2), 1, 8)

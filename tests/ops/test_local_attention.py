"""Block-local softmax attention (spe.ops.softmax.local): the L x L masked form in float64, forward and
backward at ragged lengths, locality (one block back seen, two blocks back not), the decoding cache
of at most two blocks, and the skewing of queries at the end of their keys."""

import pytest
import torch

from spe.ops.relative import music_relative_attention_reference
from spe.ops.softmax.local import (
    block_keep,
    block_local_attention,
    block_local_step,
    prefill_block_cache,
    relative_block_attention,
    skew_queries_last,
)
from spe.ops.softmax.naive import block_local_reference

N = 4  # positions per block


def _qkv(n, *, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, n, 3, 5, generator=g, dtype=torch.float64, requires_grad=requires_grad)
            for _ in range(3)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [1, 3, 4, 9, 12, 14])
def test_equals_the_masked_float64_form_forward_and_backward(causal, n):
    q, k, v = _qkv(n, requires_grad=True)
    y = block_local_attention(q, k, v, N, causal=causal)
    ref = block_local_reference(q, k, v, N, causal=causal)
    torch.testing.assert_close(y, ref)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (q, k, v), g)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want)


def test_encoder_key_padding_matches_the_reference_at_real_queries():
    q, k, v = _qkv(11)
    mask = torch.zeros(2, 11, dtype=torch.bool)
    mask[1, 6:] = True  # the second sequence has 6 real tokens: its last block of keys is all padding
    y = block_local_attention(q, k, v, N, causal=False, key_padding_mask=mask)
    ref = block_local_reference(q, k, v, N, causal=False, key_padding_mask=mask)
    assert torch.isfinite(y).all()  # a query whose window is all padding still gets a finite output
    torch.testing.assert_close(y[0], ref[0])
    torch.testing.assert_close(y[1, :6], ref[1, :6])


@pytest.mark.parametrize("causal", [True, False])
def test_a_key_two_blocks_back_changes_nothing_one_block_back_does(causal):
    q, k, v = _qkv(16)
    y = block_local_attention(q, k, v, N, causal=causal)
    k2, v2 = k.clone(), v.clone()
    k2[:, 5] += 3.0  # position 5: block 1
    v2[:, 5] += 3.0
    y2 = block_local_attention(q, k2, v2, N, causal=causal)
    changed = (y2 - y).abs().amax(dim=(0, 2, 3)) > 1e-12  # per query position
    assert not changed[12:].any()  # block 3: two blocks after it
    assert changed[8:12].all()  # block 2: the block after it
    assert changed[5:8].all() and bool(changed[4]) != causal  # its own block (causal: from position 5 on)
    assert not changed[:4].any()  # block 0: before it (a block never sees the next one)


def test_block_keep_is_its_own_block_causally_and_the_whole_previous_one():
    keep = block_keep(9, 9, 3, causal=True)
    assert keep[5].tolist() == [True] * 6 + [False] * 3
    assert keep[6].tolist() == [False, False, False, True, True, True, True, False, False]
    assert keep[2].tolist() == [True, True, True, False, False, False, False, False, False]
    assert block_keep(9, 9, 3, causal=False)[3].tolist() == [True] * 6 + [False] * 3


@pytest.mark.parametrize("n", [1, 4, 7, 13])
def test_decoding_equals_the_parallel_form_with_at_most_two_blocks_of_keys(n):
    q, k, v = _qkv(n)
    y = block_local_attention(q, k, v, N, causal=True)
    cache, outs = None, []
    for t in range(n):
        out, cache = block_local_step(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], cache, N)
        assert cache.keys.shape[1] == t - max(0, (t // N - 1) * N) + 1 <= 2 * N
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=1), y)


def test_prefill_then_steps_equal_the_parallel_form():
    q, k, v = _qkv(13)
    y = block_local_attention(q, k, v, N, causal=True)
    cache = prefill_block_cache(k[:, :6], v[:, :6], N)
    assert cache.keys.shape[1] == 6 and cache.position == 6
    outs = [block_local_attention(q[:, :6], k[:, :6], v[:, :6], N, causal=True)]
    for t in range(6, 13):
        out, cache = block_local_step(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], cache, N)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=1), y)
    assert prefill_block_cache(k, v, N).keys.shape[1] == 5  # block 2 and position 12, a ragged block 3


def test_skew_queries_last_reads_the_distance_of_each_pair():
    lq, lk = 3, 7
    rel = torch.arange(lq * lk, dtype=torch.float64).reshape(lq, lk)
    out = skew_queries_last(rel)
    for i in range(lq):
        for j in range(lk - lq + i + 1):  # keys up to the query's position lk - lq + i
            r = j - (lk - lq + i)
            assert out[i, j] == rel[i, r + lk - 1]


def test_relative_block_attention_equals_the_explicit_twin():
    q, _, _ = _qkv(4, seed=1)
    _, k, v = _qkv(8, seed=2)
    table = torch.randn(8, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[:, :2] = True
    got = relative_block_attention(q, k, v, table, key_padding_mask=mask)
    want = music_relative_attention_reference(q, k, v, table, causal=True, query_offset=4, key_padding_mask=mask)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("block", [0, -2, True, 2.5])
def test_a_bad_block_is_refused_by_name(block):
    q, k, v = _qkv(5)
    with pytest.raises(ValueError, match=rf"attention_blocks.*{block!r}"):
        block_local_attention(q, k, v, block, causal=True)


def test_padding_in_a_causal_layer_and_unequal_lengths_are_refused():
    q, k, v = _qkv(5)
    with pytest.raises(ValueError, match="key_padding_mask"):
        block_local_attention(q, k, v, N, causal=True, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="4 keys"):
        block_local_attention(q, k[:, :4], v, N, causal=True)

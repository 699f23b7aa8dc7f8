"""Score encodings expose their score term: softmax(q·k/√D + score_bias) v equals attend()
(Music Transformer and ALiBi; Shaw also adds value terms, so its scores are compared)."""

import math

import pytest
import torch

from spe.encodings import ALiBi, MusicRelativePosition, ShawRelativePosition


def _qkv(lq, lk):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, n, 3, 4, generator=g, dtype=torch.float64) for n in (lq, lk, lk)]


def _attend_with_bias(q, k, v, bias, causal, offset):
    logits = torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(q.shape[-1]) + bias
    if causal:
        lag = torch.arange(q.shape[1])[:, None] + offset - torch.arange(k.shape[1])[None, :]
        logits = logits.masked_fill(lag < 0, -math.inf)
    return torch.einsum("bhmn,bnhd->bmhd", logits.softmax(-1), v)


@pytest.mark.parametrize("make", [lambda c: MusicRelativePosition(3, 4, 5, causal=c), lambda c: ALiBi(3, causal=c)])
@pytest.mark.parametrize("causal,lq,lk,offset", [(True, 9, 9, 0), (False, 9, 9, 0), (True, 1, 12, 11),
                                                 (True, 3, 12, 9)])
def test_score_bias_reproduces_attend(make, causal, lq, lk, offset):
    enc = make(causal).double()
    q, k, v = _qkv(lq, lk)
    bias = enc.score_bias(q, lk, query_offset=offset)
    assert bias.shape == (2, 3, lq, lk)
    torch.testing.assert_close(_attend_with_bias(q, k, v, bias, causal, offset),
                               enc.attend(q, k, v, query_offset=offset))


@pytest.mark.parametrize("causal", [True, False])
def test_shaw_score_bias_is_q_dot_clipped_relative_key_over_sqrt_d(causal):
    enc = ShawRelativePosition(4, 3, causal=causal).double()
    q, _, _ = _qkv(6, 6)
    bias = enc.score_bias(q, 6)
    for i, j in [(5, 0), (5, 4), (2, 2), (0, 5)]:
        r = max(-3, min(3, j - i))
        row = (min(r, 0) if causal else r) + 3
        want = torch.einsum("bhd,d->bh", q[:, i], enc.rel_keys[row]) / 2.0
        if causal and j > i:
            continue  # masked
        torch.testing.assert_close(bias[:, :, i, j], want)

"""The synthetic tasks' generators against plain-Python readings of their definitions."""

import math

import pytest
import torch

from spe.lab.synth.data import (BIT0, IGNORE, IGNORE_INSTRUCTION, READ, WRITE, check_length, flip_flop, mqar,
                                mqar_pairs, split_seed, vocabulary)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _flip_flop_targets(tokens: list[int]) -> list[int]:
    """The definition read literally: after each r the bit last written, −100 elsewhere."""
    targets, last = [IGNORE] * len(tokens), None
    for t in range(0, len(tokens), 2):
        instruction, bit = tokens[t], tokens[t + 1]
        if instruction == WRITE:
            last = bit
        elif instruction == READ:
            assert last is not None, "a read before any write"
            targets[t] = last
    return targets


@pytest.mark.parametrize("p_ignore", [0.8, 0.98, 0.1])
def test_flip_flop_targets_are_the_last_written_bit(p_ignore):
    tokens, targets = flip_flop(64, 40, p_ignore=p_ignore, generator=_gen(1))
    assert tokens.shape == targets.shape == (64, 40)
    for row, target in zip(tokens.tolist(), targets.tolist()):
        assert row[0] == WRITE and row[-2] == READ  # every sequence starts with a write and has a read
        assert all(i in (WRITE, READ, IGNORE_INSTRUCTION) for i in row[0::2])
        assert all(b in (BIT0, BIT0 + 1) for b in row[1::2])
        assert target == _flip_flop_targets(row)
        # the target is also the token that follows: next-token prediction
        assert all(t == IGNORE or t == row[i + 1] for i, t in enumerate(target))


@pytest.mark.parametrize("p_ignore", [0.8, 0.98, 0.1])
def test_flip_flop_instruction_rates_hold_within_binomial_tolerance(p_ignore):
    tokens, _ = flip_flop(4000, 64, p_ignore=p_ignore, generator=_gen(2))
    inner = tokens[:, 2:-2:2]  # the first (w) and last (r) instructions are fixed
    n = inner.numel()
    for token, p in ((IGNORE_INSTRUCTION, p_ignore), (WRITE, (1 - p_ignore) / 2), (READ, (1 - p_ignore) / 2)):
        rate = (inner == token).float().mean().item()
        assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / n), (token, rate, p)  # 5 binomial std: p ≈ 6e-7 to fail
    bits = tokens[:, 1::2] - BIT0
    written = bits[tokens[:, 0::2] != READ].float()
    assert abs(written.mean().item() - 0.5) < 5 * math.sqrt(0.25 / written.numel())  # uniform bits


def _check_mqar(tokens: list[int], targets: list[int], n: int, num_keys: int, num_values: int) -> None:
    keys = range(1, 1 + num_keys)
    values = range(1 + num_keys, 1 + num_keys + num_values)
    pair_keys = tokens[0:2 * n:2]
    assert len(set(pair_keys)) == n and all(k in keys for k in pair_keys)
    assert all(v in values for v in tokens[1:2 * n:2])
    bound = dict(zip(pair_keys, tokens[1:2 * n:2]))
    queried = [p for p, t in enumerate(targets) if t != IGNORE]
    assert len(queried) == n and all(p >= 2 * n and p % 2 == 0 for p in queried)
    assert sorted(tokens[p] for p in queried) == sorted(pair_keys)  # every key queried once
    for p in queried:
        assert targets[p] == bound[tokens[p]] == tokens[p + 1]  # the answer is the bound value
    rest = [t for p, t in enumerate(tokens[2 * n:], start=2 * n) if p not in queried and p - 1 not in queried]
    assert set(rest) <= {0}  # filler elsewhere


def test_mqar_answers_are_the_bound_values_and_vocabularies_are_disjoint():
    vocab = vocabulary("mqar", num_keys=16, num_values=12)
    key_ids = {i for name, i in vocab.items() if name.startswith("k")}
    value_ids = {i for name, i in vocab.items() if name.startswith("v")}
    assert not key_ids & value_ids and len(vocab) == 1 + 16 + 12
    for n, length in ((1, 4), (5, 40), (16, 64)):
        tokens, targets = mqar(32, length, num_pairs=n, num_keys=16, num_values=12, generator=_gen(n))
        for row, target in zip(tokens.tolist(), targets.tolist()):
            _check_mqar(row, target, n, 16, 12)


def test_mqar_pairs_grow_as_the_square_root_of_length_within_their_caps():
    assert [mqar_pairs(t, 64, 8, 128) for t in (64, 256, 1024, 4096)] == [8, 16, 32, 64]
    assert mqar_pairs(4096, 64, 8, 40) == 40  # distinct keys
    assert mqar_pairs(8, 64, 8, 128) == 2  # room for every query: at most T / 4


def test_generators_are_deterministic_per_seed():
    a = flip_flop(8, 32, p_ignore=0.8, generator=_gen(3))
    b = flip_flop(8, 32, p_ignore=0.8, generator=_gen(3))
    c = flip_flop(8, 32, p_ignore=0.8, generator=_gen(4))
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and not torch.equal(a[0], c[0])
    m = [mqar(8, 64, num_pairs=8, num_keys=32, num_values=32, generator=_gen(s)) for s in (5, 5, 6)]
    assert torch.equal(m[0][0], m[1][0]) and torch.equal(m[0][1], m[1][1]) and not torch.equal(m[0][0], m[2][0])
    assert split_seed("flip-flop", "test", "sparse", 256, 0) == split_seed("flip-flop", "test", "sparse", 256, 0)
    assert len({split_seed("mqar", "test", d, t, 0) for d in ("more-pairs", "same-pairs") for t in (64, 256)}) == 4


@pytest.mark.parametrize("length", [0, 2, 5, 7, -4, True])
def test_lengths_that_do_not_fit_the_layout_are_refused(length):
    with pytest.raises(ValueError, match="even number of tokens ≥ 4"):
        check_length("flip-flop", length)


def test_mqar_refuses_more_pairs_than_fit():
    with pytest.raises(ValueError, match="num_pairs"):
        mqar(1, 16, num_pairs=5, num_keys=32, num_values=8, generator=_gen(0))
    with pytest.raises(ValueError, match="num_pairs"):
        mqar(1, 64, num_pairs=9, num_keys=8, num_values=8, generator=_gen(0))

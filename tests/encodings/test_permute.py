"""PermuteFormer: P^m from the cycles of P (never m compositions), seeded and kept in checkpoints."""

import math

import pytest
import torch

from spe.encodings import PermuteFeatures
from spe.encodings.permute import cycle_tables, permutation_powers, random_permutations
from spe.models import DecoderLM, ModelConfig


def _composed(p: torch.Tensor, m: int) -> torch.Tensor:
    # p^m by m compositions of the index map, the slow way (m ≥ 0)
    index = torch.arange(p.shape[-1]).expand_as(p)
    for _ in range(m):
        index = p.gather(-1, index)
    return index


def test_powers_from_cycles_equal_m_fold_composition_at_any_position():
    p = random_permutations(3, 11, generator=torch.Generator().manual_seed(0))
    tables = cycle_tables(p)
    positions = torch.arange(0, 40)
    powers = permutation_powers(tables, positions)
    for m in range(40):
        assert torch.equal(powers[m], _composed(p, m)), m
    # far and negative positions: one modulo per index, P^m · P^(−m) = identity
    far = permutation_powers(tables, torch.tensor([10**12, -(10**12)]))
    assert torch.equal(far[1].gather(-1, far[0]), torch.arange(11).expand(3, -1))
    order = math.lcm(*tables[2].flatten().tolist())  # P^order = identity for every head
    assert torch.equal(permutation_powers(tables, torch.tensor([order + 5]))[0], _composed(p, 5))


def test_the_transform_applies_p_to_the_features():
    t = PermuteFeatures(2, 5, generator=torch.Generator().manual_seed(1))
    x = torch.rand(1, 3, 2, 5)
    y = t(x, torch.tensor([0, 1, 2]))
    torch.testing.assert_close(y[:, 0], x[:, 0])
    for h in range(2):
        p = t.permutation[h]
        torch.testing.assert_close(y[0, 1, h], x[0, 1, h][p])  # (P x)_i = x_{p_i}
        torch.testing.assert_close(y[0, 2, h], x[0, 2, h][p][p])


def test_permutations_come_from_the_seeded_generator_and_the_checkpoint():
    a, b = PermuteFeatures(4, 16, seed=7), PermuteFeatures(4, 16, seed=7)
    assert torch.equal(a.permutation, b.permutation)
    assert not torch.equal(a.permutation, PermuteFeatures(4, 16, seed=8).permutation)
    assert list(a.state_dict()) == ["permutation"]  # the cycle tables are derived, not saved
    config = ModelConfig(vocab_size=20, d_model=16, num_heads=2, num_layers=1, d_ff=16, num_features=8,
                         positional="permute", permute_seed=3)
    model = DecoderLM(config).eval()
    other = DecoderLM(ModelConfig(**{**config.to_dict(), "permute_seed": 4})).eval()
    tokens = torch.randint(0, 20, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.equal(other(tokens), model(tokens))
        other.load_state_dict(model.state_dict())  # rebuilds the cycle tables of the loaded permutation
        torch.testing.assert_close(other(tokens), model(tokens), atol=0, rtol=0)


def test_positions_must_be_integers_and_rows_permutations():
    t = PermuteFeatures(2, 4)
    with pytest.raises(ValueError, match=r"positions must be integers, got \[0.5\]"):
        t(torch.rand(1, 2, 2, 4), torch.tensor([0.5, 1.0]))
    torch.testing.assert_close(t(torch.ones(1, 2, 2, 4), torch.tensor([0.0, 1.0])), torch.ones(1, 2, 2, 4))
    with pytest.raises(ValueError, match="permutation of 0"):
        cycle_tables(torch.tensor([[0, 0, 1]]))
    with pytest.raises(ValueError, match=r"permutes \(H, M\) = \(2, 4\) features, got \(2, 5\)"):
        t(torch.rand(1, 2, 2, 5), torch.arange(2))

"""Absolute encodings: learned embeddings refuse positions they do not have."""

import pytest
import torch

from spe.encodings import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


def test_learned_embedding_adds_the_row_of_each_position():
    torch.manual_seed(0)
    ape = LearnedPositionalEmbedding(10, 4)
    x = torch.zeros(2, 3, 4)
    torch.testing.assert_close(ape(x, torch.tensor([0, 7, 9])), ape.weight[[0, 7, 9]].expand(2, 3, 4))


def test_learned_embedding_raises_beyond_its_maximum_instead_of_indexing_out_of_range():
    ape = LearnedPositionalEmbedding(10, 4)
    with pytest.raises(ValueError, match=r"0 … 9, got position 10"):
        ape(torch.zeros(1, 11, 4), torch.arange(11))
    with pytest.raises(ValueError, match="got position -1"):
        ape(torch.zeros(1, 1, 4), torch.tensor([-1]))
    with pytest.raises(ValueError, match="integer"):
        ape(torch.zeros(1, 2, 4), torch.tensor([0.0, 0.5]))


def test_sinusoidal_encoding_matches_vaswani_formula():
    pe = SinusoidalPositionalEncoding(6)(torch.zeros(1, 4, 6), torch.arange(4))
    pos, i = 3, 1
    torch.testing.assert_close(pe[0, pos, 2 * i], torch.tensor(float(torch.sin(torch.tensor(pos / 10000 ** (2 * i / 6))))))
    torch.testing.assert_close(pe[0, pos, 2 * i + 1], torch.tensor(float(torch.cos(torch.tensor(pos / 10000 ** (2 * i / 6))))))

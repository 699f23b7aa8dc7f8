"""Embedded LRA proxies: balanced, disjoint, seeded, nothing that names the class left in the text."""

import numpy as np
import pytest
import torch

from spe.lab.lra.data.proxies import MASS_SECTIONS, image_proxy, palestrina_movements, retrieval_proxy, text_proxy

pytest.importorskip("music21")


def _rows(tokens, lengths):
    return [bytes((t[:n].long() - 2).tolist()) for t, n in zip(tokens, lengths)]


@pytest.fixture(scope="module")
def movements():
    return palestrina_movements()


@pytest.mark.slow
def test_text_proxy_is_balanced_disjoint_seeded_and_hides_the_section(movements):
    data = text_proxy(max_length=1000, seed=0)
    assert [len(data[s]) for s in ("train", "val", "test")] == [756, 96, 90]
    docs = {}
    for split, ds in data.items():
        assert torch.bincount(ds.labels, minlength=6).unique().numel() == 1  # balanced
        assert ds.num_classes == 6 and ds.tokens.shape[1] == 1000 and ds.vocab_size == 258
        docs[split] = _rows(ds.tokens, ds.lengths)
    # Labels follow the file's section: each document is the start of a movement of that section.
    by_prefix = {}
    for body, section, _ in movements:
        by_prefix.setdefault(body[:1000], set()).add(section)
    for ds, rows in ((data["test"], docs["test"]), (data["train"], docs["train"][:100])):
        assert all(label in by_prefix[row] for label, row in zip(ds.labels.tolist(), rows))
    assert not set(docs["train"]) & set(docs["test"]) and not set(docs["val"]) & set(docs["test"])
    # The reference records (title, mass, section) are gone: no '!' line, no section name.
    for body, _, _ in movements[::10]:
        assert not any(line.startswith(b"!") for line in body.splitlines())
        assert not any(name.encode() in body for name in MASS_SECTIONS)
    again = text_proxy(max_length=1000, seed=0)["val"]
    assert torch.equal(again.tokens, data["val"].tokens) and torch.equal(again.labels, data["val"].labels)
    assert not torch.equal(text_proxy(max_length=1000, seed=1)["val"].tokens, data["val"].tokens)


@pytest.mark.slow
def test_retrieval_proxy_pairs_share_a_mass_exactly_when_labelled_one(movements):
    data = retrieval_proxy(max_length=4000, seed=0, per_mass=5)
    mass_of = {}
    for body, _, mass in movements:
        mass_of.setdefault(body[:4000], set()).add(mass)
    masses_by_split = {}
    for split, ds in data.items():
        assert ds.labels.float().mean() == 0.5 and ds.tokens1.shape[1] == 4000 and ds.num_classes == 2
        first, second = _rows(ds.tokens1, ds.lengths1), _rows(ds.tokens2, ds.lengths2)
        for a, b, y in zip(first, second, ds.labels.tolist()):
            assert bool(mass_of[a] & mass_of[b]) == bool(y) and a != b
        masses_by_split[split] = set().union(*(mass_of[d] for d in first + second))
    assert not masses_by_split["train"] & masses_by_split["test"]
    assert not masses_by_split["val"] & (masses_by_split["train"] | masses_by_split["test"])
    again = retrieval_proxy(max_length=4000, seed=0, per_mass=5)["test"]
    assert torch.equal(again.tokens1, data["test"].tokens1) and torch.equal(again.labels, data["test"].labels)


@pytest.mark.slow
def test_image_proxy_is_the_digits_upsampled_balanced_and_seeded():
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    data = image_proxy(seed=0)
    assert [len(data[s]) for s in ("train", "val", "test")] == [1390, 170, 180]
    lookup = {}
    for image, label in zip(digits.images, digits.target):
        lookup.setdefault(image.astype(np.uint8).tobytes(), set()).add(int(label))
    for ds in data.values():
        assert ds.grid == (32, 32) and ds.tokens.shape[1] == 1024 and torch.all(ds.lengths == 1024)
        assert torch.bincount(ds.labels, minlength=10).unique().numel() == 1
        grid = (ds.tokens.long() - 2).view(-1, 32, 32)
        # Every 4 × 4 block is one pixel; its level / (255/16) is the digit's 0–16 value.
        assert torch.equal(grid, grid[:, ::4, ::4].repeat_interleave(4, 1).repeat_interleave(4, 2))
        small = torch.round(grid[:, ::4, ::4].double() * 16 / 255).to(torch.uint8).numpy()
        for image, label in zip(small[:50], ds.labels[:50].tolist()):
            assert label in lookup[image.tobytes()]
    assert torch.equal(image_proxy(seed=0)["test"].tokens, data["test"].tokens)
    assert not torch.equal(image_proxy(seed=1)["test"].tokens, data["test"].tokens)

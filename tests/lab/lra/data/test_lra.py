"""LRA Text / Retrieval / Image loaders on tiny fixtures in the official formats; embedded proxies."""

import pickle

import numpy as np
import pytest
import torch

from spe.lab.lra.data.dataset import CLS_ID, PAD_ID, PairDataset, SequenceDataset, pack, pad_sequences, split_off
from spe.lab.lra.data.image import grey_levels, load_cifar10, read_cifar_batch
from spe.lab.lra.data.retrieval import load_aan, read_aan_tsv
from spe.lab.lra.data.text import load_imdb


def _decode(tokens, length):
    """Byte ids back to bytes (id = byte + 2)."""
    return bytes((tokens[:length].long() - 2).tolist())


@pytest.fixture
def imdb(tmp_path):
    reviews = {("train", "pos"): ["Great film!", "Loved it \u00e9\u00e9"],
               ("train", "neg"): ["Dull.\nVery dull."],
               ("test", "pos"): ["A" * 30], ("test", "neg"): ["bad", "worse"]}
    for (split, label), texts in reviews.items():
        folder = tmp_path / "aclImdb" / split / label
        folder.mkdir(parents=True)
        for i, text in enumerate(texts):
            (folder / f"{i}_{7 + i}.txt").write_bytes(text.encode("utf-8"))
    (tmp_path / "aclImdb" / "train" / "unsup").mkdir()
    (tmp_path / "aclImdb" / "train" / "unsup" / "0_0.txt").write_text("ignored")
    return tmp_path / "aclImdb", reviews


def test_imdb_reads_bytes_labels_and_truncates(imdb):
    root, reviews = imdb
    data = load_imdb(root, max_length=12)
    train = data["train"]
    assert train.vocab_size == 258 and train.num_classes == 2 and train.labels.tolist() == [0, 1, 1]
    expected = [t.encode("utf-8") for t in reviews[("train", "neg")] + reviews[("train", "pos")]]
    for i, doc in enumerate(expected):  # every byte kept (non-ASCII as its UTF-8 bytes), cut at 12
        assert _decode(train.tokens[i], train.lengths[i]) == doc[:12]
        assert train.lengths[i] == min(len(doc), 12) and not train.tokens[i, train.lengths[i]:].any()
    assert train.mask.sum(1).tolist() == train.lengths.tolist()
    assert data["test"].lengths.tolist() == [3, 5, 12]
    assert load_imdb(root, max_length=4000)["test"].tokens.shape == (3, 4000)


def test_imdb_errors_name_the_layout(imdb, tmp_path):
    root, _ = imdb
    with pytest.raises(FileNotFoundError, match=r"aclImdb/\{train,test\}/\{pos,neg\}"):
        load_imdb(tmp_path / "missing")
    for f in (root / "test" / "neg").iterdir():
        f.unlink()
    with pytest.raises(ValueError, match=r"test/neg holds no .txt"):
        load_imdb(root)
    (root / "test" / "neg").rmdir()
    with pytest.raises(FileNotFoundError, match=r"test/neg"):
        load_imdb(root)
    (root / "train" / "pos" / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty.txt is empty"):
        load_imdb(root, splits=("train",))


def _write_aan(folder, rows_by_file):
    folder.mkdir(exist_ok=True)
    for name, rows in rows_by_file.items():
        (folder / name).write_bytes(b"".join(b"\t".join(r) + b"\r\n" for r in rows))


def test_aan_pairs_keep_both_documents_and_quotes(tmp_path):
    rows = [(b"1.0", b"P1", b"P2", b'a "quoted" text', b"second doc"), (b"0", b"P3", b"P4", b"x" * 10, b"y")]
    _write_aan(tmp_path, {f"new_aan_pairs.{s}.tsv": rows for s in ("train", "eval", "test")})
    labels, first, second = read_aan_tsv(tmp_path / "new_aan_pairs.eval.tsv")
    assert labels == [1, 0] and first == [b'a "quoted" text', b"x" * 10] and second == [b"second doc", b"y"]
    data = load_aan(tmp_path, max_length=8)
    val = data["val"]
    assert isinstance(val, PairDataset) and val.labels.tolist() == [1, 0] and val.tokens1.shape == (2, 8)
    assert _decode(val.tokens1[0], val.lengths1[0]) == b'a "quote' and _decode(val.tokens2[1], 1) == b"y"
    assert val.lengths2.tolist() == [8, 1] and val.mask2.sum().item() == 9
    tokens1, lengths1, tokens2, lengths2, labels = val.batch([1])
    assert tokens1.dtype == torch.long and labels.tolist() == [0] and lengths2.tolist() == [1]


@pytest.mark.parametrize("row,match", [
    (b"1\tP1\tP2\tonly four", r"eval.tsv:2: expected 5 tab-separated fields"),
    (b"2\tP1\tP2\ta\tb", r"eval.tsv:2: label must be 0 or 1"),
    (b"yes\tP1\tP2\ta\tb", r"eval.tsv:2: label must be 0 or 1"),
    (b"1\tP1\tP2\t\tb", r"eval.tsv:2: empty document"),
])
def test_aan_malformed_rows_name_file_and_line(tmp_path, row, match):
    (tmp_path / "new_aan_pairs.eval.tsv").write_bytes(b"0\tA\tB\tx\ty\n" + row + b"\n")
    with pytest.raises(ValueError, match=match):
        read_aan_tsv(tmp_path / "new_aan_pairs.eval.tsv")


def test_aan_missing_file_names_the_layout(tmp_path):
    _write_aan(tmp_path, {"new_aan_pairs.train.tsv": [(b"1", b"a", b"b", b"c", b"d")]})
    with pytest.raises(FileNotFoundError, match=r"new_aan_pairs.eval.tsv.*new_aan_pairs.\{train,eval,test\}"):
        load_aan(tmp_path)


def _cifar_batch(path, rng, n, *, str_keys=False):
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n).tolist()
    keys = ("data", "labels") if str_keys else (b"data", b"labels")
    with open(path, "wb") as f:
        pickle.dump({keys[0]: data, keys[1]: labels, b"batch_label": b"fixture"}, f, protocol=2)
    return data, labels


def test_cifar_batches_become_grey_level_sequences(tmp_path):
    rng = np.random.default_rng(0)
    written = [_cifar_batch(tmp_path / f"data_batch_{i}", rng, 3, str_keys=i == 2) for i in range(1, 6)]
    test_data, test_labels = _cifar_batch(tmp_path / "test_batch", rng, 4)
    data = load_cifar10(tmp_path)
    train, test = data["train"], data["test"]
    assert train.tokens.shape == (15, 1024) and test.grid == (32, 32) and test.vocab_size == 258
    assert train.labels.tolist() == [y for _, labels in written for y in labels]
    assert test.labels.tolist() == test_labels and test.lengths.tolist() == [1024] * 4
    # Pixel (row 5, column 7) of image 2, by hand from its red, green and blue planes.
    r, g, b = (int(test_data[2, plane * 1024 + 5 * 32 + 7]) for plane in range(3))
    assert int(test.tokens[2, 5 * 32 + 7]) - 2 == round(0.299 * r + 0.587 * g + 0.114 * b)
    assert grey_levels(np.array([[255] * 3072], dtype=np.uint8)).tolist() == [[255] * 1024]


def test_cifar_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_batch_1 … data_batch_5 and test_batch"):
        load_cifar10(tmp_path)
    path = tmp_path / "data_batch_1"
    path.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="data_batch_1 is not a python batch"):
        read_cifar_batch(path)
    with open(path, "wb") as f:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(ValueError, match=r"expected data \(N, 3072\) uint8"):
        read_cifar_batch(path)
    with open(path, "wb") as f:
        pickle.dump({b"pixels": 1}, f)
    with pytest.raises(ValueError, match="missing 'data' or 'labels'"):
        read_cifar_batch(path)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with open(path, "wb") as f:
        pickle.dump({b"data": Evil(), b"labels": []}, f)
    with pytest.raises(ValueError, match=r"refusing to load builtins\.print"):
        read_cifar_batch(path)


def test_padding_and_truncation_helpers():
    tokens, lengths = pad_sequences([[5, 6, 7], [8], [9, 10, 11, 12, 13]], 4, vocab_size=300)
    assert tokens.dtype == torch.int16 and lengths.tolist() == [3, 1, 4]
    assert tokens.tolist() == [[5, 6, 7, PAD_ID], [8, 0, 0, 0], [9, 10, 11, 12]]
    tokens, _ = pack(np.array([3, 4, 5]), np.array([2, 1]), None, vocab_size=10)
    assert tokens.dtype == torch.uint8 and tokens.tolist() == [[3, 4], [5, 0]]
    with pytest.raises(ValueError, match="example 1 is empty"):
        pad_sequences([[3], []], None, vocab_size=10)
    with pytest.raises(ValueError, match="positive integer"):
        pad_sequences([[3]], 0, vocab_size=10)
    assert CLS_ID == 1  # reserved: never produced by the loaders (content ids start at 2)


def test_split_off_is_stratified_disjoint_and_seeded():
    ds = SequenceDataset(torch.arange(40).view(20, 2), torch.full((20,), 2), torch.arange(20) % 2, 50, 2)
    rest, held = split_off(ds, 0.3, seed=1)
    assert len(rest) + len(held) == 20 and torch.bincount(held.labels).tolist() == [3, 3]
    assert not set(rest.tokens[:, 0].tolist()) & set(held.tokens[:, 0].tolist())
    assert torch.equal(split_off(ds, 0.3, seed=1)[1].tokens, held.tokens)
    assert not torch.equal(split_off(ds, 0.3, seed=2)[1].tokens, held.tokens)


def test_cifar_reads_the_python2_module_name_of_the_official_files(tmp_path):
    # The official batches were pickled under Python 2 with numpy.core.multiarray._reconstruct.
    blob = pickle.dumps({b"data": np.full((1, 3072), 7, np.uint8), b"labels": [3]}, protocol=2)
    (tmp_path / "test_batch").write_bytes(blob.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    data, labels = read_cifar_batch(tmp_path / "test_batch")
    assert data.shape == (1, 3072) and labels.tolist() == [3]


@pytest.mark.slow
def test_load_task_gives_three_splits_for_every_task(tmp_path, imdb):
    from spe.lab.lra.data.listops import write_splits
    from spe.lab.lra.data import TASKS, load_task

    write_splits(tmp_path / "listops", num_train=6, num_val=2, num_test=2, max_depth=4, min_length=5,
                 max_length=40)
    rng = np.random.default_rng(1)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        _cifar_batch(tmp_path / name, rng, 10)
    row = (b"1", b"a", b"b", b"c", b"d")
    _write_aan(tmp_path / "aan", {f"new_aan_pairs.{s}.tsv": [row] for s in ("train", "eval", "test")})
    folders = {"listops": tmp_path / "listops", "text": imdb[0], "retrieval": tmp_path / "aan",
               "image": tmp_path}
    for task in TASKS:
        data = load_task(task, folders[task], val_fraction=0.5)
        assert sorted(data) == ["test", "train", "val"] and all(len(d) for d in data.values())
    image = load_task("image", tmp_path, val_fraction=0.2, seed=3)
    assert len(image["train"]) + len(image["val"]) == 50 and image["val"].grid == (32, 32)
    assert load_task("text", imdb[0], max_length=5, val_fraction=0.5)["test"].tokens.shape == (3, 5)
    assert load_task("image", None)["train"].grid == (32, 32)  # embedded proxy
    with pytest.raises(ValueError, match="unknown LRA task 'cifar'"):
        load_task("cifar")

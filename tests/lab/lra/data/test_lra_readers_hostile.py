"""LRA readers on hostile inputs: empty splits, FIFOs and folders
where files are expected, fields longer than csv's default limit, deep nesting, bytes that are
not UTF-8 and labels that are digits only to Unicode."""

import csv
import os
import pickle
import threading
import warnings

import numpy as np
import pytest

from spe.lab.cli.main import main
from spe.lab.lra.data.listops import SPLIT_FILES, evaluate, load_listops, read_tsv
from spe.lab.lra.data import load_task
from spe.lab.lra.data.image import read_cifar_batch
from spe.lab.lra.data.retrieval import read_aan_tsv
from spe.lab.lra.data.text import load_imdb

ROW = "( ( ( [MAX 2 ) 9 ) ] )\t9\n"


def _imdb(root, per_class):
    for split in ("train", "test"):
        for label in ("neg", "pos"):
            folder = root / "aclImdb" / split / label
            folder.mkdir(parents=True)
            for i in range(per_class):
                (folder / f"{i}.txt").write_bytes(f"{label} review {i}".encode())
    return root / "aclImdb"


def _listops(folder, extra_train=b""):
    folder.mkdir(exist_ok=True)
    for name in SPLIT_FILES.values():
        (folder / name).write_bytes(("Source\tTarget\n" + ROW).encode())
    with open(folder / SPLIT_FILES["train"], "ab") as f:
        f.write(extra_train)
    return folder


# F7 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("per_class,fraction,message", [
    (5, 0.1, r"LRA text: the validation split is empty \(train 10, val 0, test 10 examples\); "
             r"val_fraction 0.1 holds out round\(0.1 × n\) of the n training examples of each class \(n = 5, 5\)"),
    (1, 0.9, r"LRA text: the train split is empty \(train 0, val 2, test 2 examples\); val_fraction 0.9"),
])
def test_an_empty_split_is_an_error_naming_task_split_counts_and_fraction(tmp_path, per_class, fraction, message):
    with pytest.raises(ValueError, match=message):
        load_task("text", _imdb(tmp_path, per_class), val_fraction=fraction)
    if per_class == 5:  # a larger fraction holds one out of each class
        assert load_task("text", tmp_path / "aclImdb", val_fraction=0.2)["val"].labels.tolist() == [0, 1]


def test_the_cli_refuses_an_empty_validation_split_in_one_line(tmp_path, capsys):
    code = main(["lra", "--task", "text", "--data", str(_imdb(tmp_path, 5)), "--steps", "1",
                 "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("spe lra: error: LRA text: the validation split is empty")
    assert sum("error" in line for line in err) == 1


# F8 -------------------------------------------------------------------------------------------

def _without_hanging(call, fifo, seconds=20.0):
    """``call()`` in a thread; if it is still blocked after ``seconds`` (opening ``fifo``), the
    FIFO is opened for writing and closed, which releases the reader, and the test fails."""
    outcome = {}

    def run():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                outcome["value"] = call()
            except Exception as err:  # noqa: BLE001 - handed to the test
                outcome["error"] = err
        outcome["warnings"] = [str(w.message) for w in caught]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
        pytest.fail(f"the reader blocked on the FIFO {fifo}")
    return outcome


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_imdb_skips_fifos_and_folders_named_txt_and_names_them(tmp_path):
    root = _imdb(tmp_path, 2)
    fifo = root / "train" / "neg" / "fifo.txt"  # neg is read first: the FIFO comes before the folder
    os.mkfifo(fifo)
    (root / "train" / "pos" / "3.txt").mkdir()
    outcome = _without_hanging(lambda: load_imdb(root), fifo)
    assert "error" not in outcome, outcome.get("error")
    assert len(outcome["value"]["train"]) == 4 and outcome["value"]["train"].labels.tolist() == [0, 0, 1, 1]
    shown = "\n".join(outcome["warnings"])
    assert "skipped 1 path(s) that are not regular files" in shown
    assert "train/neg/fifo.txt" in shown and "train/pos/3.txt" in shown


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("reader,name", [(read_tsv, "basic_train.tsv"), (read_aan_tsv, "new_aan_pairs.train.tsv"),
                                         (read_cifar_batch, "data_batch_1")])
def test_data_files_that_are_fifos_or_folders_are_named_as_such(tmp_path, reader, name):
    os.mkfifo(tmp_path / name)
    outcome = _without_hanging(lambda: reader(tmp_path / name), tmp_path / name)
    assert isinstance(outcome.get("error"), ValueError)
    assert f"{name} is not a regular file (a folder, FIFO or device)" in str(outcome["error"])
    (tmp_path / name).unlink()
    (tmp_path / name).mkdir()
    with pytest.raises(ValueError, match="is not a regular file"):
        reader(tmp_path / name)


# F9 -------------------------------------------------------------------------------------------

def test_a_field_beyond_the_csv_default_limit_is_read_and_the_limit_restored(tmp_path):
    limit = csv.field_size_limit()
    source = "( " * 70_000 + "[MAX 1 ]" + " )" * 70_000  # 280,008 characters, over 131,072
    folder = _listops(tmp_path / "lo", f"{source}\t1\n".encode())
    assert read_tsv(folder / "basic_train.tsv")[-1] == (source, 1)
    assert csv.field_size_limit() == limit
    data = load_listops(folder, verify=True, max_length=140_003)  # an explicit length: no cap
    assert data["train"].lengths.tolist() == [10, 140_003]
    with pytest.raises(ValueError, match=r"basic_train.tsv:3 .*140,003 tokens.*2,000.*--seq-len"):
        load_listops(folder)  # refused before padding every row to 140,003


@pytest.mark.slow
def test_fifty_thousand_nested_operators_are_read_and_evaluated_without_recursion(tmp_path):
    deep = "[MAX " * 50_000 + "7 " + "] " * 50_000
    folder = _listops(tmp_path / "lo", f"{deep}\t7\n".encode())
    assert load_listops(folder, verify=True, max_length=100_001)["train"].lengths.tolist() == [10, 100_001]
    unclosed = _listops(tmp_path / "bad", ("[MAX " * 50_000 + "7\t7\n").encode())
    with pytest.raises(ValueError, match=r"basic_train.tsv:3: evaluate: incomplete expression \(50000 open"):
        load_listops(unclosed, verify=True, max_length=100_001)


# F11 ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line,match", [
    (b"( ( [MAX 2 \xff ) ] )\t2\n", r"basic_train.tsv:3: byte 0xff at column 12 is not UTF-8 text"),
    ("( ( [MAX 2 ) ] )\t²\n".encode(), r"basic_train.tsv:3: expected 'expression<TAB>digit' \(one of 0-9\)"),
    ("( ( [MAX 3 ) ] )\t٣\n".encode(), r"basic_train.tsv:3: expected 'expression<TAB>digit' \(one of 0-9\)"),
])
def test_listops_reader_errors_name_file_and_line_and_labels_are_ascii_digits(tmp_path, line, match):
    folder = _listops(tmp_path, line)
    with pytest.raises(ValueError, match=match):
        load_listops(folder)


def test_the_cli_names_file_and_line_of_a_unicode_digit_label(tmp_path, capsys):
    folder = _listops(tmp_path / "lo", "( ( [MAX 3 ) ] )\t٣\n".encode())
    assert main(["lra", "--task", "listops", "--data", str(folder), "--steps", "1",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("spe lra: error: ") and "basic_train.tsv:3: expected" in err[-1]


def test_evaluate_takes_ascii_digits_only():
    assert evaluate("( ( ( [SM 3 ) 4 ) ] )") == 7
    for digit in ("٣", "²", "３"):
        with pytest.raises(ValueError, match="unknown symbol"):
            evaluate(f"( ( ( [SM {digit} ) 4 ) ] )")


@pytest.mark.parametrize("label,expected", [(b"1", 1), (b"0.0", 0), (b"1.", 1), (b" 1 ", 1), (b"+1", None),
                                            (b"1e0", None), (b"0_0", None), ("١".encode(), None)])
def test_aan_labels_are_ascii_0_or_1(tmp_path, label, expected):
    path = tmp_path / "new_aan_pairs.eval.tsv"
    path.write_bytes(b"0\tA\tB\tx\ty\n" + label + b"\tP1\tP2\ta\tb\n")
    if expected is None:
        with pytest.raises(ValueError, match=r"eval.tsv:2: label must be 0 or 1"):
            read_aan_tsv(path)
    else:
        assert read_aan_tsv(path)[0] == [0, expected]


@pytest.mark.parametrize("labels", [[3.7, 1.0], ["3", "1"], ["٣", "1"], [True, False]])
def test_cifar_labels_must_be_integers(tmp_path, labels):
    path = tmp_path / "data_batch_1"
    with open(path, "wb") as f:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": labels}, f, protocol=2)
    with pytest.raises(ValueError, match=r"data_batch_1: labels must be integers in 0–9"):
        read_cifar_batch(path)

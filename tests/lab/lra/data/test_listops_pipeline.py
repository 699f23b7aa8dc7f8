"""The lra-2021 ListOps pipeline: LRA's original words (no ``]``, no parentheses); the lossless one unchanged."""

import re

import pytest

from spe.lab.lra.data.listops import ListOpsTokenizer, generate, load_listops, read_tsv, write_splits

# [MAX 2 9 [MIN 0 1 ] [SM 3 [MED 4 5 6 ] ] ] in LRA's binarised layout
TEXT = ("( ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 0 ) 1 ) ] ) ) ( ( ( [SM 3 ) ( ( ( ( [MED 4 ) 5 ) 6 ) ] ) ) ] ) ) ] )")


def _tfds_words(text: str) -> list[str]:
    """TFDS's ``Tokenizer()`` (alphanum_only): maximal runs of alphanumeric characters, the rest dropped."""
    return re.findall(r"[A-Za-z0-9]+", text)


def test_a_known_expression_gives_exactly_lra_s_words():
    tok = ListOpsTokenizer(pipeline="lra-2021")
    ids = tok.encode(TEXT)
    # ids: 0 padding, 1 CLS, 2 MAX, 3 MIN, 4 MED, 5 SM, 6 + d for the digit d
    assert ids == [2, 8, 15, 3, 6, 7, 5, 9, 4, 10, 11, 12]
    assert tok.decode(ids) == "MAX 2 9 MIN 0 1 SM 3 MED 4 5 6" == " ".join(_tfds_words(TEXT))
    assert tok.vocab_size == 16
    # drop_parentheses changes nothing there (they are gone anyway)
    assert ListOpsTokenizer(pipeline="lra-2021", drop_parentheses=True).encode(TEXT) == ids


def test_generated_data_gives_tfds_s_words_on_the_fast_and_slow_paths():
    tok = ListOpsTokenizer(pipeline="lra-2021")
    words = {w: i + 2 for i, w in enumerate(["MAX", "MIN", "MED", "SM", *"0123456789"])}
    sources = [s for s, _ in generate(20, seed=3, max_depth=6, min_length=20, max_length=300)]
    flat, sizes = tok.encode_many(sources)
    start = 0
    for source, size in zip(sources, sizes.tolist()):
        expected = [words[w] for w in _tfds_words(source)]
        assert tok.encode(source) == expected == flat[start:start + size].tolist()
        assert tok.encode_array(source + " ").tolist() == expected  # a trailing blank: the slow path
        start += size


def test_the_lossless_pipeline_keeps_every_symbol_with_the_same_ids():
    tok = ListOpsTokenizer()
    symbols = ["(", ")", "]", "[MAX", "[MIN", "[MED", "[SM", *"0123456789"]
    assert tok.encode(TEXT) == [symbols.index(s) + 2 for s in TEXT.split()]
    assert tok.encode("( ( [MAX 2 ) 9 ] )") == [2, 2, 5, 11, 3, 18, 4, 3] and tok.vocab_size == 19
    assert ListOpsTokenizer(pipeline="lossless").encode(TEXT) == tok.encode(TEXT)


def test_load_listops_reads_the_pipeline_and_refuses_an_unknown_one(tmp_path):
    write_splits(tmp_path, num_train=6, num_val=2, num_test=2, seed=1, max_depth=4, max_args=3, min_length=5,
                 max_length=60)
    data = load_listops(tmp_path, pipeline="lra-2021")
    rows = read_tsv(tmp_path / "basic_train.tsv")
    assert data["train"].vocab_size == 16
    assert data["train"].lengths.tolist() == [len(_tfds_words(s)) for s, _ in rows]
    with pytest.raises(ValueError, match="ListOps pipeline must be one of lossless, lra-2021, got 'lra'"):
        load_listops(tmp_path, pipeline="lra")

"""ListOps (Nangia & Bowman 2018) as generated for the Long Range Arena (Tay et al. 2021).

Letters: N = examples, L = padded length (tokens).

An expression is a tree: a node is a digit 0–9 with probability 0.75 (always at the maximum
depth; the root is at depth 1), otherwise an operator with 2 to ``max_args`` arguments:
``[MAX``, ``[MIN``, ``[MED`` (integer part of the median) or ``[SM`` (sum modulo 10); an
operator's list ends with ``]``. Its length counts operators, closing brackets and digits;
LRA keeps trees with ``min_length < length < max_length`` (defaults 500 and 2,000, depth 10,
10 arguments), distinct, 96,000 / 2,000 / 2,000 for train / val / test, ten classes.

Text layout, as LRA writes it: the tree is binarised, each pair written ``( A B )`` with
single spaces, so ``[MAX 2 9 ]`` reads ``( ( ( [MAX 2 ) 9 ) ] )``. Files are tab-separated
with a ``Source``/``Target`` header: ``basic_train.tsv``, ``basic_val.tsv``, ``basic_test.tsv``.
The parentheses carry no information beyond ``[OP`` and ``]``; :class:`ListOpsTokenizer` keeps
every symbol, including ``]`` (pipeline ``lossless``, the default). Pipeline ``lra-2021`` feeds a
model what LRA's original input pipeline fed it (``lra_benchmarks/listops/input_pipeline.py`` as
released in 2020-2021, used by the SPE paper): TFDS's ``Tokenizer`` splits the text into words of
alphanumeric characters and drops everything else, so ``[MAX`` becomes ``MAX``, digits stay, and
every ``]``, ``(`` and ``)`` is gone: an operator's extent is no longer in the input.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from spe.lab.lra.data.dataset import CONTENT_OFFSET, SequenceDataset, pack, regular_file

__all__ = [
    "LISTOPS_MAX_TOKENS",
    "OPERATORS",
    "PIPELINES",
    "SPLIT_FILES",
    "ListOpsTokenizer",
    "count_expressions",
    "evaluate",
    "generate",
    "listops_folder",
    "load_listops",
    "read_tsv",
    "write_splits",
    "write_tsv",
]

log = logging.getLogger(__name__)

OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
END = "]"
# How expressions become tokens: every symbol kept (default), or LRA's original word split.
PIPELINES = ("lossless", "lra-2021")
SPLIT_FILES = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}
_HEADER = ["Source", "Target"]
_LAYOUT = ("a folder with basic_train.tsv, basic_val.tsv, basic_test.tsv, each a tab-separated "
           "'Source<TAB>Target' header then one 'expression<TAB>digit' row per example")
_LETTERS = {"[MAX": "a", "[MIN": "b", "[MED": "c", "[SM": "d"}  # one byte per operator (tokenizer)
_BYTE_KIND = np.full(128, 2, dtype=np.uint8)  # ASCII byte -> 0 whitespace, 1 newline, 2 part of a symbol
_BYTE_KIND[[ord(c) for c in " \t\r\x0b\x0c"]] = 0
_BYTE_KIND[ord("\n")] = 1
_DIGITS = {str(d): d for d in range(10)}  # ASCII only: str.isdigit() and int() also take "²", "٣"
_DIGIT_TEXT = [f" {d} )" for d in range(10)]  # an argument that is a digit, with its closing pair
_VALUE_P = 0.25  # probability that a node above the maximum depth is an operator


def _apply(op: str, args: list[int]) -> int:
    if op == "[MAX":
        return max(args)
    if op == "[MIN":
        return min(args)
    if op == "[SM":
        return sum(args) % 10
    ordered = sorted(args)  # [MED: integer part of the median (values are ≥ 0, so floor)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) // 2


def _operator(rng: random.Random, depth: int, max_depth: int, max_args: int, budget: int,
              out: list[str]) -> tuple[int, int]:
    """Appends the text of an operator node at ``depth`` to ``out``; returns (value, length).

    Stops growing once the length reaches ``budget`` (such a tree is rejected, so its text no
    longer matters). Leaves are drawn inline and ``int(random() · k)`` replaces ``randrange(k)``:
    the same distributions, three times faster than one call per node.
    """
    n = 2 + int(rng.random() * (max_args - 1))
    op = OPERATORS[int(rng.random() * len(OPERATORS))]
    out.append("( " * (n + 1) + op)
    args, length = [], 2
    leaves_only = depth + 1 >= max_depth
    for _ in range(n):
        if leaves_only or rng.random() > _VALUE_P:
            value = int(rng.random() * 10)
            out.append(_DIGIT_TEXT[value])
            length += 1
        else:
            out.append(" ")
            value, size = _operator(rng, depth + 1, max_depth, max_args, budget - length, out)
            out.append(" )")
            length += size
            if length >= budget:
                return 0, length
        args.append(value)
    out.append(" ] )")
    return _apply(op, args), length


def count_expressions(*, max_depth: int, max_args: int, min_length: int, max_length: int,
                      cap: int | None = None) -> int:
    """How many distinct expressions :func:`generate` can draw (``min_length < length < max_length``).

    An expression's text determines its tree, so this counts trees: ``T_d(x)``, the number of
    trees rooted at depth d by length, is ``10 x`` (a digit) plus, above the maximum depth,
    ``4 x² Σ_{n=2}^{max_args} T_{d+1}(x)^n`` (an operator, its ``]`` and n arguments); the
    answer sums the coefficients of ``T_1`` between the bounds. Polynomials are cut at
    ``max_length`` and counts saturate at ``cap``: ``min(true count, cap)`` is then exact in
    float64 (every partial sum below the cap is an integer below 2^53, and a term that
    reaches the cap keeps the sum there), which answers "are there ``cap`` of them?" in
    ``O(max_depth · max_args · max_length²)`` rather than in numbers of 10^1000 digits.

    Args:
        max_depth, max_args, min_length, max_length: as :func:`generate`.
        cap: stop counting here (None: 2^52).

    Returns:
        ``min(count, cap)``.
    """
    cap = float(2 ** 52 if cap is None else min(cap, 2 ** 52))
    size = max(max_length, 2)  # coefficients of x^0 … x^(max_length - 1)
    tree = np.zeros(size)
    tree[1] = 10.0  # the digits, the only trees at the maximum depth
    for _ in range(max_depth - 1):  # from depth max_depth - 1 up to the root
        power, lists = tree, np.zeros(size)
        for _ in range(2, max_args + 1):
            power = np.minimum(np.convolve(power, tree)[:size], cap)
            lists = np.minimum(lists + power, cap)
        tree = np.zeros(size)
        tree[1] = 10.0
        tree[2:] = np.minimum(tree[2:] + 4.0 * lists[:size - 2], cap)
    return int(min(tree[min_length + 1:max_length].sum(), cap))


def generate(num_samples: int, *, seed: int = 0, max_depth: int = 10, max_args: int = 10,
             min_length: int = 500, max_length: int = 2000) -> list[tuple[str, int]]:
    """Draws distinct ListOps expressions with LRA's procedure.

    Args:
        num_samples: N, number of distinct expressions.
        seed: seeds a private ``random.Random``: same arguments, same list.
        max_depth: nodes at this depth (root = 1) are digits.
        max_args: an operator has 2 … max_args arguments.
        min_length, max_length: keep expressions with min_length < length < max_length, the
            length counting operators, ``]`` and digits.

    Returns:
        N (source, label) pairs: source in LRA's binarised text layout, label = :func:`evaluate`.

    Raises:
        ValueError: on a count or depth < 1, ``max_args`` < 2, ``min_length`` < 0, or fewer
            distinct expressions within the bounds than ``num_samples``
            (:func:`count_expressions`; drawing would never end).
    """
    for name, value, low in (("num_samples", num_samples, 1), ("max_depth", max_depth, 1),
                             ("max_args", max_args, 2), ("min_length", min_length, 0)):
        if isinstance(value, bool) or int(value) != value or value < low:
            raise ValueError(f"generate: {name} must be an integer ≥ {low}, got {value!r}")
    if max_length <= min_length + 1:
        raise ValueError(f"generate: no integer length L satisfies {min_length} < L < {max_length}")
    if max_depth == 1 and not min_length < 1 < max_length:
        raise ValueError(f"generate: at max_depth 1 every expression is one digit (length 1), "
                         f"outside {min_length} < L < {max_length}")
    available = count_expressions(max_depth=max_depth, max_args=max_args, min_length=min_length,
                                  max_length=max_length, cap=num_samples)
    if available < num_samples:
        raise ValueError(f"generate: {num_samples} distinct expressions asked for, but only {available} "
                         f"exist with max_depth {max_depth}, max_args {max_args} and "
                         f"{min_length} < length < {max_length}")
    rng = random.Random(seed)
    found: dict[str, int] = {}
    while len(found) < num_samples:
        if max_depth <= 1 or rng.random() > _VALUE_P:  # the root is a digit
            value = int(rng.random() * 10)
            out, length = [str(value)], 1
        else:
            out = []
            value, length = _operator(rng, 1, max_depth, max_args, max_length, out)
        if min_length < length < max_length:
            found.setdefault("".join(out), value)
    return list(found.items())


def evaluate(source: str) -> int:
    """The value of a ListOps expression (LRA's layout, or without the binarising parentheses).

    Args:
        source: whitespace-separated symbols: ``[MAX``, ``[MIN``, ``[MED``, ``[SM``, ``]``, digits,
            ``(``, ``)``.

    Returns:
        The digit the expression evaluates to.

    Raises:
        ValueError: on an unknown symbol, an operator without arguments, unbalanced ``[OP``/``]``
            or parentheses, or symbols after the end of the expression.
    """
    stack: list[tuple[str, list[int]]] = []
    result, depth = None, 0
    for i, sym in enumerate(source.split()):
        if result is not None and sym != ")":
            raise ValueError(f"evaluate: symbol {i} {sym!r} after the end of the expression "
                             f"in {source[:80]!r}")
        if sym in ("(", ")"):
            depth += 1 if sym == "(" else -1
            if depth < 0:
                raise ValueError(f"evaluate: unbalanced ')' at symbol {i} in {source[:80]!r}")
            continue
        if sym in OPERATORS:
            stack.append((sym, []))
            continue
        if sym == END:
            if not stack or not stack[-1][1]:
                what = "no operator" if not stack else "an empty list"
                raise ValueError(f"evaluate: ']' at symbol {i} closes {what}")
            op, args = stack.pop()
            value = _apply(op, args)
        elif sym in _DIGITS:
            value = _DIGITS[sym]
        else:
            raise ValueError(f"evaluate: unknown symbol {sym!r} at {i}; "
                             f"allowed: {', '.join(OPERATORS)}, ], (, ), 0-9")
        if stack:
            stack[-1][1].append(value)
        else:
            result = value
    if result is None or depth:
        raise ValueError(f"evaluate: incomplete expression ({len(stack)} open operators, "
                         f"{depth} open parentheses)")
    return result


class ListOpsTokenizer:
    """Symbol-level ids that keep every character of the text layout (or LRA's original words).

    Pipeline ``lossless``: ids 0 = padding, 1 = CLS, then ``(``, ``)``, ``]``, ``[MAX``, ``[MIN``,
    ``[MED``, ``[SM``, ``0`` … ``9`` (vocab_size 19); ``decode(encode(s)) == " ".join(s.split())``.

    Pipeline ``lra-2021``: the words of LRA's original pipeline (TFDS ``Tokenizer``: maximal runs
    of alphanumeric characters, the rest dropped): ids 0 = padding, 1 = CLS, then ``MAX``,
    ``MIN``, ``MED``, ``SM``, ``0`` … ``9`` (vocab_size 16); ``( ( [MAX 2 ) 9 ) ]`` is
    ``MAX 2 9``. (LRA numbered its words in the order of a Python set; any fixed order gives
    the model the same information.)

    Args:
        drop_parentheses: leave out the binarising ``(`` and ``)`` (about two thirds of the symbols;
            they are implied by ``[OP`` and ``]``, so nothing is lost for the task, but decode no
            longer restores them). Implied by ``lra-2021``.
        pipeline: one of ``PIPELINES``.

    Raises:
        ValueError: for an unknown pipeline.
    """

    SYMBOLS = ("(", ")", END, *OPERATORS, *"0123456789")
    WORDS = (*(op.lstrip("[") for op in OPERATORS), *"0123456789")  # lra-2021

    def __init__(self, *, drop_parentheses: bool = False, pipeline: str = "lossless") -> None:
        if pipeline not in PIPELINES:
            raise ValueError(f"ListOps pipeline must be one of {', '.join(PIPELINES)}, got {pipeline!r}")
        self.drop_parentheses, self.pipeline = drop_parentheses, pipeline
        self.ids = {s: i + CONTENT_OFFSET for i, s in enumerate(self.SYMBOLS)}
        self._table = np.full(128, -1, dtype=np.int16)
        for sym, i in self.ids.items():
            self._table[ord(_LETTERS.get(sym, sym))] = i
        self._first_kept = self.ids[END]  # "(" and ")" come first in SYMBOLS
        self._words: np.ndarray | None = None
        if pipeline == "lra-2021":
            # symbol id -> word id (−1: no alphanumeric character, dropped)
            self._words = np.full(CONTENT_OFFSET + len(self.SYMBOLS), -1, dtype=np.int16)
            for i, word in enumerate(self.WORDS):
                self._words[self.ids[self.SYMBOLS[3 + i]]] = i + CONTENT_OFFSET
        self.vocab_size = CONTENT_OFFSET + len(self.WORDS if self._words is not None else self.SYMBOLS)

    def encode(self, source: str) -> list[int]:
        """Ids of the symbols of ``source`` (split on whitespace).

        Raises:
            ValueError: naming the first symbol that is not in the vocabulary.
        """
        return self.encode_array(source).tolist()

    def encode_array(self, source: str) -> np.ndarray:
        """As :meth:`encode`, as an int64 array."""
        fast = self._encode_fast(source) if "\n" not in source else None
        if fast is not None:
            return fast[0][fast[0] >= 0].astype(np.int64)
        try:
            ids = [self.ids[s] for s in source.split() if not (self.drop_parentheses and s in "()")]
        except KeyError as err:
            raise ValueError(f"ListOpsTokenizer: unknown symbol {err.args[0]!r}; "
                             f"known: {' '.join(self.SYMBOLS)}") from None
        ids = self._to_words(np.asarray(ids, dtype=np.int64))
        return ids[ids >= 0]

    def _to_words(self, ids: np.ndarray) -> np.ndarray:
        """lra-2021: symbol ids (−1 kept) to word ids, −1 where a symbol has no word; else unchanged."""
        if self._words is None:
            return ids
        return np.where(ids >= 0, self._words[np.maximum(ids, 0)], -1).astype(ids.dtype)

    def encode_many(self, sources: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encodes many expressions at once (vectorised over the whole list).

        Returns:
            all ids concatenated (int16) and the (N,) number of ids of each source (int64).

        Raises:
            ValueError: as :meth:`encode`, for the first source that fails.
        """
        parts = [self._encode_chunk(sources[i:i + 1024]) for i in range(0, len(sources), 1024)]
        if not parts:
            return np.zeros(0, np.int16), np.zeros(0, np.int64)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _encode_chunk(self, sources: list[str]) -> tuple[np.ndarray, np.ndarray]:
        fast = self._encode_fast("\n".join(sources)) if all("\n" not in s for s in sources) else None
        if fast is None:
            arrays = [self.encode_array(s) for s in sources]
            return np.concatenate(arrays), np.array([a.size for a in arrays], dtype=np.int64)
        ids, newline = fast
        # A source's ids end at its newline: count the kept ids before each newline.
        ends = np.cumsum(ids >= 0)[newline]
        bounds = np.concatenate([[0], ends, [int((ids >= 0).sum())]])
        return ids[ids >= 0], np.diff(bounds)

    def _encode_fast(self, text: str) -> tuple[np.ndarray, np.ndarray] | None:
        # Operators become one letter each, so every symbol is one byte and a lookup table maps
        # the bytes; anything unusual (those letters already present, a symbol of several
        # characters left, a byte outside the table) returns None for the slow path to name it.
        # Returns ids with −1 at the newlines (and at dropped parentheses) and the newline indices.
        if any(letter in text for letter in _LETTERS.values()) or not text.isascii():
            return None
        for op, letter in _LETTERS.items():
            text = text.replace(op, letter)
        raw = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
        kind = _BYTE_KIND[raw]
        newline, symbol = kind == 1, kind == 2
        if (symbol[1:] & symbol[:-1]).any():
            return None
        ids = self._table[raw[symbol]]
        if (ids < 0).any():
            return None
        out = np.full(int(symbol.sum() + newline.sum()), -1, dtype=np.int16)
        keep = symbol[symbol | newline]
        out[keep] = np.where(ids >= self._first_kept, ids, -1) if self.drop_parentheses else ids
        return self._to_words(out), np.flatnonzero(~keep)

    def decode(self, ids) -> str:
        """Text of the ids, single-spaced (lra-2021: its words); padding and CLS are skipped."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        names = self.WORDS if self._words is not None else self.SYMBOLS
        return " ".join(names[i - CONTENT_OFFSET] for i in ids if i >= CONTENT_OFFSET)


def write_tsv(path: str | os.PathLike, examples: list[tuple[str, int]]) -> Path:
    """Writes (source, label) rows under a ``Source``/``Target`` header, tab-separated (LRA's layout)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(_HEADER)
        writer.writerows(examples)
    return path


def write_splits(folder: str | os.PathLike, *, num_train: int = 96_000, num_val: int = 2_000,
                 num_test: int = 2_000, seed: int = 0, **options) -> Path:
    """Generates distinct expressions and writes ``basic_{train,val,test}.tsv`` into ``folder``.

    Args:
        folder: created if missing.
        num_train, num_val, num_test: split sizes (LRA: 96,000 / 2,000 / 2,000).
        seed: as for :func:`generate`; the splits are consecutive slices of one draw, so no
            expression is in two splits.
        options: ``max_depth``, ``max_args``, ``min_length``, ``max_length`` of :func:`generate`.

    Returns:
        The folder.
    """
    examples = generate(num_train + num_val + num_test, seed=seed, **options)
    bounds = {"train": (0, num_train), "val": (num_train, num_train + num_val),
              "test": (num_train + num_val, len(examples))}
    for split, (start, stop) in bounds.items():
        write_tsv(Path(folder) / SPLIT_FILES[split], examples[start:stop])
    return Path(folder)


def listops_folder(cache_dir: str | os.PathLike | None = None, *, num_train: int = 96_000,
                   num_val: int = 2_000, num_test: int = 2_000, seed: int = 0, **options) -> Path:
    """The embedded default: LRA-style splits generated once and cached.

    Args:
        cache_dir: parent of the folder (default ``default_cache_dir()/lra``, i.e.
            ``$SPE_CACHE_DIR/lra`` or ``~/.cache/spe/lab/lra``).
        num_train, num_val, num_test, seed, options: as for :func:`write_splits`; they name the folder.

    Returns:
        ``cache_dir/listops-…`` holding the three TSV files (written to a temporary folder then
        renamed, so an interrupted run leaves no half-written data).
    """
    from spe.lab.outputs import default_cache_dir  # the project's one cache location

    settings = {"max_depth": 10, "max_args": 10, "min_length": 500, "max_length": 2000, **options}
    name = (f"listops-{num_train}-{num_val}-{num_test}-seed{seed}-depth{settings['max_depth']}"
            f"-args{settings['max_args']}-len{settings['min_length']}-{settings['max_length']}")
    parent = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "lra"
    folder = parent / name
    if all((folder / f).is_file() for f in SPLIT_FILES.values()):
        return folder
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=parent))
    try:
        log.info("generating ListOps into %s", folder)
        write_splits(tmp, num_train=num_train, num_val=num_val, num_test=num_test, seed=seed, **settings)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


@contextlib.contextmanager
def _field_size_limit(limit: int) -> Iterator[None]:
    """Raises ``csv.field_size_limit`` to at least ``limit`` for the block, then restores it.

    The limit is global to the ``csv`` module (131,072 characters by default, which a generated
    expression of more than about 20,000 symbols exceeds). It is restored on leaving, so other
    readers see it raised only meanwhile; a thread that sets it in the meantime has its value
    replaced on leaving.
    """
    previous = csv.field_size_limit()
    csv.field_size_limit(max(previous, limit))
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def _utf8_lines(path: Path, raw_lines) -> Iterator[str]:
    """The lines of a binary file as text; an invalid UTF-8 byte is a ValueError at ``path:line``."""
    for line, raw in enumerate(raw_lines, start=1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}:{line}: byte {raw[err.start]:#04x} at column {err.start + 1} is not "
                             f"UTF-8 text") from None


# The longest ListOps row read without an explicit length: LRA's input pipeline truncates at
# 2,000 tokens (its generator keeps expressions under 2,000 symbols); every row is padded to
# the longest, so one 70,000-token row would cost 35× the memory of the whole set.
LISTOPS_MAX_TOKENS = 2000


def read_tsv(path: str | os.PathLike) -> list[tuple[str, int]]:
    """Reads an LRA ListOps TSV file (UTF-8).

    Fields may be as long as the file (``csv.field_size_limit`` is raised to the file's size while
    it is read, then restored; see :func:`_field_size_limit`).

    Returns:
        (source, label) rows, label in 0–9.

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: naming the file and line of a wrong header, a row without two columns, a
            label that is not one ASCII digit, a byte that is not UTF-8 or a malformed CSV row
            (the expressions are checked by :func:`load_listops`); naming the file if it is not
            a regular file or holds no example.
    """
    path = regular_file(path, "ListOps", _LAYOUT)
    rows = []
    with open(path, "rb") as f, _field_size_limit(os.fstat(f.fileno()).st_size + 1):
        reader = csv.reader(_utf8_lines(path, f), delimiter="\t")
        try:
            for row in reader:
                line = reader.line_num
                if line == 1:
                    if row != _HEADER:
                        raise ValueError(f"{path}:1: expected the header 'Source<TAB>Target', got {row!r:.120}")
                    continue
                if len(row) != 2 or row[1].strip() not in _DIGITS:
                    raise ValueError(f"{path}:{line}: expected 'expression<TAB>digit' (one of 0-9), "
                                     f"got {row!r:.120}")
                rows.append((row[0], _DIGITS[row[1].strip()]))
        except csv.Error as err:
            raise ValueError(f"{path}:{reader.line_num}: {err}") from None
    if not rows:
        raise ValueError(f"{path}: no examples after the header; expected {_LAYOUT}")
    return rows


def _encode_rows(path: Path, rows: list[tuple[str, int]], tok: ListOpsTokenizer,
                 verify: bool) -> tuple[np.ndarray, np.ndarray]:
    try:
        flat, sizes = tok.encode_many([source for source, _ in rows])
    except ValueError:
        flat, sizes = None, None
    if flat is None or verify or sizes.min() == 0:
        # Slow path, row by row, to name the line (line 1 is the header).
        for line, (source, label) in enumerate(rows, start=2):
            try:
                tok.encode_array(source)
                value = evaluate(source)  # also rejects an empty or unbalanced expression
            except ValueError as err:
                raise ValueError(f"{path}:{line}: {err}") from None
            if verify and value != label:
                raise ValueError(f"{path}:{line}: label {label} but the expression evaluates to {value}")
    return flat, sizes


def load_listops(folder: str | os.PathLike, *, max_length: int | None = None,
                 drop_parentheses: bool = False, verify: bool = False,
                 pipeline: str = "lossless") -> dict[str, SequenceDataset]:
    """Reads the three ListOps splits of ``folder`` as token ids.

    Args:
        folder: holds ``basic_train.tsv``, ``basic_val.tsv``, ``basic_test.tsv`` (:func:`write_splits`).
        max_length: L, pad/truncate every split to L symbols (a truncated expression loses its
            meaning: choose L ≥ the longest); None pads each split to its longest example,
            which may not exceed :data:`LISTOPS_MAX_TOKENS` (refused before any padding).
        drop_parentheses: see :class:`ListOpsTokenizer`.
        verify: also evaluate every expression and check it against its label (slower: about a
            minute for LRA's 100,000 examples).
        pipeline: ``lossless`` (every symbol) or ``lra-2021`` (LRA's original words: no ``]``, no
            parentheses); see :class:`ListOpsTokenizer`.

    Returns:
        ``{"train", "val", "test"}`` → :class:`SequenceDataset` (vocab_size 19, or 16 with
        ``lra-2021``; num_classes 10).

    Raises:
        FileNotFoundError: if the folder or a split file is missing (naming the layout).
        ValueError: without ``max_length``, naming the file and line of a row longer than
            :data:`LISTOPS_MAX_TOKENS`; as :func:`read_tsv`, and naming the file and line of an unknown symbol (or,
            with ``verify``, a malformed expression or a wrong label); for an unknown pipeline.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"ListOps: no folder {folder}; expected {_LAYOUT}")
    tok = ListOpsTokenizer(drop_parentheses=drop_parentheses, pipeline=pipeline)
    out = {}
    for split, name in SPLIT_FILES.items():
        rows = read_tsv(folder / name)
        flat, sizes = _encode_rows(folder / name, rows, tok, verify)
        if max_length is None and sizes.size and int(sizes.max()) > LISTOPS_MAX_TOKENS:
            line = int(np.argmax(sizes)) + 2  # line 1 is the header
            raise ValueError(f"ListOps: {folder / name}:{line} has {int(sizes.max()):,} tokens, more than the "
                             f"{LISTOPS_MAX_TOKENS:,} that LRA's pipeline keeps (every row is padded to the "
                             f"longest): remove it, or pass a length (spe lra --seq-len N) to truncate every row "
                             f"to N tokens")
        tokens, lengths = pack(flat, sizes, max_length, tok.vocab_size, what=f"ListOps {split}")
        out[split] = SequenceDataset(tokens, lengths, torch.tensor([y for _, y in rows]), tok.vocab_size, 10)
    return out

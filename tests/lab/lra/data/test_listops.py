"""ListOps: labels against independent evaluators, LRA's length rule and layout, lossless tokens, loaders."""

import random
import statistics

import pytest
import torch

from spe.lab.lra.data.listops import (
    OPERATORS,
    SPLIT_FILES,
    ListOpsTokenizer,
    count_expressions,
    evaluate,
    generate,
    listops_folder,
    load_listops,
    read_tsv,
    write_splits,
    write_tsv,
)

_PY = {"[MAX": "max", "[MIN": "min", "[MED": "med", "[SM": "sm"}
_FUNCS = {"max": max, "min": min, "med": lambda a: int(statistics.median(a)), "sm": lambda a: sum(a) % 10}


def python_value(source: str) -> int:
    """Independent evaluator 1: translate to a Python expression (parentheses dropped) and eval it."""
    parts = []
    for sym in source.split():
        if sym in _PY:
            parts.append(f"{_PY[sym]}([")
        elif sym == "]":
            parts.append("]),")
        elif sym.isdigit():
            parts.append(f"{sym},")
    return eval("".join(parts).rstrip(","), {"__builtins__": {}}, _FUNCS)


def pair_value(source: str) -> int:
    """Independent evaluator 2: reads the binarised '( A B )' pairs as written, then folds
    each pair left to right: (op, x) opens a list, (list, x) extends it, (list, ']') closes it."""
    syms = source.split()

    def parse(i):
        if syms[i] != "(":
            return syms[i], i + 1
        left, i = parse(i + 1)
        right, i = parse(i)
        assert syms[i] == ")", f"pair not closed at {i}"
        return (left, right), i + 1

    def fold(t):
        if isinstance(t, str):
            return t if t in OPERATORS or t == "]" else int(t)
        left, right = fold(t[0]), fold(t[1])
        if isinstance(left, str):
            return (left, [right])
        if right == "]":
            return _FUNCS[_PY[left[0]]](left[1])
        return (left[0], left[1] + [right])

    tree, end = parse(0)
    assert end == len(syms)
    return fold(tree)


def random_tree(rng, depth):
    """A tree with 1 … 4 arguments per operator (single arguments included), every operator."""
    if depth == 0 or rng.random() < 0.3:
        return rng.randrange(10)
    return (rng.choice(OPERATORS), [random_tree(rng, depth - 1) for _ in range(rng.randint(1, 4))])


def render(tree, parens=True):
    if isinstance(tree, int):
        return str(tree)
    op, args = tree
    if not parens:
        return " ".join([op, *(render(a, False) for a in args), "]"])
    text = "( " * (len(args) + 1) + op + "".join(f" {render(a)} )" for a in args)
    return text + " ] )"


def tree_value(tree):
    if isinstance(tree, int):
        return tree
    op, args = tree
    return _FUNCS[_PY[op]]([tree_value(a) for a in args])


def symbol_length(source):
    """LRA's length: operators, closing brackets and digits (not the parentheses)."""
    return sum(s not in "()" for s in source.split())


@pytest.mark.slow
def test_evaluate_matches_a_recursive_tree_evaluator_on_random_nested_expressions():
    rng = random.Random(1)
    seen_ops, single = set(), 0
    for _ in range(400):
        tree = random_tree(rng, 5)
        text = render(tree)
        assert evaluate(text) == tree_value(tree) == pair_value(text)
        assert evaluate(render(tree, parens=False)) == tree_value(tree)
        seen_ops |= set(text.split()) & set(OPERATORS)
        single += "( ( [" in text and text.count("(") >= 2
    assert seen_ops == set(OPERATORS) and single > 0


@pytest.mark.parametrize("text,value", [
    ("( ( ( [MAX 2 ) 9 ) ] )", 9),           # the LRA example
    ("( ( [MED 7 ) ] )", 7),                 # one argument
    ("( ( ( [MED 1 ) 2 ) ] )", 1),           # even count: integer part of 1.5
    ("( ( ( [MED 0 ) 9 ) ] )", 4),           # 4.5 -> 4
    ("( ( ( ( ( [MED 9 ) 1 ) 5 ) 3 ) ] )", 4),
    ("( ( ( [SM 9 ) 9 ) ] )", 8),            # 18 mod 10
    ("( ( ( [MIN 3 ) ( ( ( [MAX 0 ) 1 ) ] ) ) ] )", 1),
    ("5", 5),
])
def test_evaluate_edge_cases(text, value):
    assert evaluate(text) == value == pair_value(text)


@pytest.mark.parametrize("text,match", [
    ("( ( [MAX ) ] )", "empty list"), ("[MAX 1 2", "incomplete"), ("1 2", "after the end"),
    ("( ( [MAX 1 ) ] ) )", "unbalanced"), ("[FOO 1 ]", "unknown symbol"), ("] 1", "closes no operator"),
    ("( ( [MAX 1 ) ]", "incomplete"),
])
def test_evaluate_rejects_malformed_expressions(text, match):
    with pytest.raises(ValueError, match=match):
        evaluate(text)


def test_generate_follows_lra_rules_and_labels_are_right():
    examples = generate(60, seed=3, max_depth=6, max_args=5, min_length=20, max_length=120)
    lengths = [symbol_length(s) for s, _ in examples]
    assert all(20 < n < 120 for n in lengths) and len(set(s for s, _ in examples)) == 60
    for source, label in examples:
        assert label == python_value(source) == pair_value(source) == evaluate(source)
        assert " ".join(source.split()) == source  # single-spaced, as LRA writes it
        # Operators take 2 … max_args arguments; operator nesting stays below max_depth.
        depth = deepest = 0
        for sym in source.split():
            depth += sym in OPERATORS
            depth -= sym == "]"
            deepest = max(deepest, depth)
        assert deepest <= 5
    counts = [len(args) for s, _ in examples for args in _argument_counts(s)]
    assert min(counts) >= 2 and max(counts) <= 5
    assert {s for src, _ in examples for s in src.split()} >= set(OPERATORS)


def _argument_counts(source):
    stack, out = [], []
    for sym in source.split():
        if sym in OPERATORS:
            stack.append(0)
        elif sym == "]":
            out.append([0] * stack.pop())
            if stack:
                stack[-1] += 1
        elif sym.isdigit() and stack:
            stack[-1] += 1
    return out


@pytest.mark.slow
def test_generate_with_lra_defaults_is_deterministic_by_seed():
    a = generate(8, seed=0)
    assert a == generate(8, seed=0) and a != generate(8, seed=1)
    assert all(500 < symbol_length(s) < 2000 for s, _ in a)
    assert all(y == pair_value(s) for s, y in a)
    with pytest.raises(ValueError, match="max_args"):
        generate(1, max_args=1)
    with pytest.raises(ValueError, match="no integer length"):
        generate(1, min_length=10, max_length=11)


def test_tokenizer_round_trips_every_symbol_of_the_layout():
    tok = ListOpsTokenizer()
    text = render(("[MAX", [2, 9, ("[MIN", [0, 1]), ("[MED", [3, 4, 5]), ("[SM", [6, 7, 8])]))
    assert text.startswith("( ( ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 0 ) 1 ) ] ) )") and pair_value(text) == 9
    ids = tok.encode(text)
    assert tok.decode(ids) == text and len(ids) == len(text.split())
    assert set(ids) == set(range(2, tok.vocab_size))  # every symbol used, none merged
    assert tok.decode(tok.encode("  ( ( [SM\t1 )\n] ) ")) == "( ( [SM 1 ) ] )"
    for source, _ in generate(5, seed=2, max_depth=5, min_length=10, max_length=200):
        assert tok.decode(torch.tensor([1, *tok.encode(source), 0, 0])) == source
    short = ListOpsTokenizer(drop_parentheses=True)
    assert short.decode(short.encode(text)) == " ".join(s for s in text.split() if s not in "()")
    with pytest.raises(ValueError, match="unknown symbol 'MAX'"):
        tok.encode("( ( MAX 1 ) ] )")


def test_splits_are_written_and_loaded_in_the_official_layout(tmp_path):
    opts = dict(max_depth=5, max_args=4, min_length=8, max_length=60)
    write_splits(tmp_path, num_train=12, num_val=3, num_test=4, seed=5, **opts)
    assert (tmp_path / "basic_train.tsv").read_bytes().startswith(b"Source\tTarget\r\n")  # csv, as LRA
    rows = {k: read_tsv(tmp_path / f) for k, f in SPLIT_FILES.items()}
    assert [len(rows[k]) for k in ("train", "val", "test")] == [12, 3, 4]
    assert [r for k in ("train", "val", "test") for r in rows[k]] == generate(19, seed=5, **opts)
    data = load_listops(tmp_path)
    tok = ListOpsTokenizer()
    for split, ds in data.items():
        assert ds.tokens.shape[0] == len(ds) and ds.vocab_size == 19 and ds.num_classes == 10
        assert ds.labels.tolist() == [y for _, y in rows[split]]
        for i, (source, _) in enumerate(rows[split]):
            assert ds.lengths[i] == len(source.split())
            assert tok.decode(ds.tokens[i]) == source
            assert not ds.tokens[i, ds.lengths[i]:].any() and ds.mask[i].sum() == ds.lengths[i]
    fixed = load_listops(tmp_path, max_length=200, drop_parentheses=True)["val"]
    assert fixed.tokens.shape == (3, 200)
    assert fixed.lengths.tolist() == [symbol_length(s) for s, _ in rows["val"]]


def test_a_hand_written_fixture_file_reads(tmp_path):
    path = tmp_path / "basic_test.tsv"
    path.write_text("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n( ( [SM 4 ) ] )\t4\n")
    assert read_tsv(path) == [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( [SM 4 ) ] )", 4)]
    write_tsv(tmp_path / "again.tsv", read_tsv(path))
    assert read_tsv(tmp_path / "again.tsv") == read_tsv(path)


@pytest.mark.parametrize("content,match", [
    ("Src\tTgt\n1\t1\n", r"basic_val.tsv:1: expected the header"),
    ("Source\tTarget\n( ( [MAX 1 ) ] )\t1\n( ( [MAX 1 ) ] )\n",
     r"basic_val.tsv:3: expected 'expression<TAB>digit'"),
    ("Source\tTarget\n( ( [MAX 1 ) ] )\t12\n", r"basic_val.tsv:2: expected"),
    ("Source\tTarget\n", "no examples"),
])
def test_malformed_files_name_the_file_and_line(tmp_path, content, match):
    path = tmp_path / "basic_val.tsv"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        read_tsv(path)


@pytest.mark.parametrize("bad,match", [
    ("( ( MAX 1 ) ] )\t1", r"basic_val.tsv:3: ListOpsTokenizer: unknown symbol 'MAX'"),
    ("( ( [MAX 12 ) ] )\t1", r"basic_val.tsv:3: ListOpsTokenizer: unknown symbol '12'"),
    ("( ( [MAX 1 ) ] ) A\t1", r"basic_val.tsv:3: ListOpsTokenizer: unknown symbol 'A'"),
    ("( ( [MAX 1 ) ] )\t2", r"basic_val.tsv:3: label 2 but the expression evaluates to 1"),
    ("( ( [MAX ) ] )\t1", r"basic_val.tsv:3: evaluate: .*empty list"),
])
def test_bad_expressions_name_the_file_and_line(tmp_path, bad, match):
    for name in SPLIT_FILES.values():
        write_tsv(tmp_path / name, [("( ( ( [SM 4 ) 5 ) ] )", 9)])
    (tmp_path / "basic_val.tsv").write_text(f"Source\tTarget\n( ( [SM 4 ) ] )\t4\n{bad}\n")
    with pytest.raises(ValueError, match=match):
        load_listops(tmp_path, verify=True)


def test_fast_and_slow_encoding_agree():
    tok, short = ListOpsTokenizer(), ListOpsTokenizer(drop_parentheses=True)
    for source, _ in generate(20, seed=4, max_depth=6, min_length=10, max_length=300):
        slow = [tok.ids[s] for s in source.split()]
        assert tok.encode(source) == slow and tok._encode_fast(source) is not None  # fast path taken
        assert short.encode(source) == [i for i, s in zip(slow, source.split()) if s not in "()"]


def test_missing_folder_or_split_names_the_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"basic_train\.tsv, basic_val\.tsv, basic_test\.tsv"):
        load_listops(tmp_path / "nope")
    write_tsv(tmp_path / "basic_train.tsv", [("1", 1)])
    with pytest.raises(FileNotFoundError, match=r"basic_val\.tsv"):
        load_listops(tmp_path)


def test_cached_folder_is_generated_once(tmp_path):
    opts = dict(num_train=5, num_val=2, num_test=2, seed=7, max_depth=4, min_length=5, max_length=40)
    folder = listops_folder(tmp_path, **opts)
    stamp = (folder / "basic_train.tsv").stat().st_mtime_ns
    assert listops_folder(tmp_path, **opts) == folder
    assert (folder / "basic_train.tsv").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no temporary folder left
    assert len(load_listops(folder)["train"]) == 5


def test_many_at_once_equals_one_by_one():
    sources = [s for s, _ in generate(15, seed=6, max_depth=6, min_length=5, max_length=200)] + ["7"]
    for tok in (ListOpsTokenizer(), ListOpsTokenizer(drop_parentheses=True)):
        flat, sizes = tok.encode_many(sources)
        assert sizes.tolist() == [len(tok.encode(s)) for s in sources]
        assert flat.tolist() == [i for s in sources for i in tok.encode(s)]
    flat, sizes = ListOpsTokenizer().encode_many(["( ( [SM\t1 ) ] )", "  5 "])  # odd spacing: same ids
    assert sizes.tolist() == [7, 1]
    with pytest.raises(ValueError, match="unknown symbol '12'"):
        ListOpsTokenizer().encode_many(["5", "( ( [SM 12 ) ] )"])


def test_length_bounds_are_strict():
    # 3 < length < 6 leaves lengths 4 and 5 only: e.g. "[SM 1 2 ]" (4) and "[MIN 1 2 3 ]" (5).
    examples = generate(40, seed=0, max_depth=3, max_args=3, min_length=3, max_length=6)
    assert {symbol_length(s) for s, _ in examples} == {4, 5}
    assert all(y == pair_value(s) for s, y in examples)


def _all_trees(depth: int, max_depth: int, max_args: int, budget: int) -> list[tuple[str, int]]:
    """Every tree rooted at ``depth`` of length < budget, as (text without parentheses, length): by enumeration."""
    trees = [(str(d), 1) for d in range(10)]
    if depth >= max_depth or budget <= 4:
        return [t for t in trees if t[1] < budget]
    children = _all_trees(depth + 1, max_depth, max_args, budget - 3)
    lists = [("", 0)]
    for n in range(1, max_args + 1):
        lists = [(f"{a} {c}".strip(), la + lc) for a, la in lists for c, lc in children if 2 + la + lc < budget]
        if n >= 2:
            trees += [(f"{op} {a} ]", 2 + la) for op in OPERATORS for a, la in lists]
    return trees


@pytest.mark.parametrize(("max_depth", "max_args", "min_length", "max_length"),
                         [(1, 2, 0, 2), (2, 2, 3, 5), (2, 3, 0, 7), (3, 2, 0, 9), (3, 3, 4, 8), (4, 2, 5, 10)])
@pytest.mark.slow
def test_the_count_of_distinct_expressions_matches_an_enumeration(max_depth, max_args, min_length, max_length):
    texts = {t for t, n in _all_trees(1, max_depth, max_args, max_length) if min_length < n}
    assert count_expressions(max_depth=max_depth, max_args=max_args, min_length=min_length,
                             max_length=max_length) == len(texts)
    assert count_expressions(max_depth=max_depth, max_args=max_args, min_length=min_length,
                             max_length=max_length, cap=3) == min(3, len(texts))


def test_asking_for_more_distinct_expressions_than_exist_raises_at_once():
    # depth 2, two arguments, length 4 only: an operator over two digits, 4 × 10 × 10 = 400 expressions
    assert len({s for s, _ in generate(400, seed=0, max_depth=2, max_args=2, min_length=3, max_length=5)}) == 400
    with pytest.raises(ValueError, match=r"401 .*only 400 .*max_depth 2.*max_args 2.*3 < length < 5"):
        generate(401, seed=0, max_depth=2, max_args=2, min_length=3, max_length=5)
    with pytest.raises(ValueError, match="11 distinct expressions asked for, but only 10 exist"):
        generate(11, max_depth=1, min_length=0, max_length=2)  # the ten digits
    # LRA's setting has more than enough: the count saturates at the request (a fraction of a second)
    assert count_expressions(max_depth=10, max_args=10, min_length=500, max_length=2000, cap=96_000) == 96_000

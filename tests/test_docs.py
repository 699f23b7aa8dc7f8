"""The README and docs/ cannot rot: every Python block runs as written (or is skipped by name,
with its reason, below), the command-line reference is what the parsers generate, every
relative link and anchor resolves, and the README's headline numbers are the cells of the
tables it cites."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]

# Python blocks that tests do not run, by the name their first line gives
# (`# docs-test: skip NAME (why)`); a marked block missing here, or a name here no block has, fails.
SKIPPED = {
    "lra-load-task": "reads the official aclImdb folder, and generates the embedded ListOps into ~/.cache",
}


def _music_run(folder: Path) -> None:
    """runs/music: a tiny music run (tests/tiny_run.py, seconds), and prompt.mid: one of its MIDI files."""
    import shutil

    from tiny_run import tiny_config

    from spe.lab.music.train import train

    train(tiny_config(folder, "runs/music"))
    shutil.copy(folder / "clean_midi" / "piece0.mid", folder / "prompt.mid")


def _music_export(folder: Path) -> None:
    """my-export/: a tiny music run trained for 2 steps, exported by `spe export`."""
    from tiny_run import tiny_config

    from spe.lab.cli.main import main
    from spe.lab.music.train import train

    run = train(tiny_config(folder, "runs/music", steps=2, eval_every=2, warmup_steps=1), progress=False)
    assert main(["export", str(run), "--out", str(folder / "my-export")]) == 0


# Python blocks that run in a folder prepared for them, by the name their first line gives
# (`# docs-test: in NAME (what it holds)`): NAME → what writes it into the block's folder.
PREPARED = {"music-run": _music_run, "music-export": _music_export}

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_SKIP = re.compile(r"^# docs-test: skip ([\w.-]+) \((.+)\)$")
_IN = re.compile(r"^# docs-test: in ([\w.-]+) \((.+)\)$")


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _python_blocks() -> list[tuple[str, str]]:
    """(page:line of the opening fence, code) of every python block of the README and docs/."""
    blocks = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            if m.group(1) == "python":
                blocks.append((f"{_rel(page)}:{text.count(chr(10), 0, m.start()) + 1}", m.group(2)))
    return blocks


def _skip_name(code: str) -> str | None:
    match = _SKIP.match(code.split("\n", 1)[0])
    return match.group(1) if match else None


def _folder_name(code: str) -> str | None:
    match = _IN.match(code.split("\n", 1)[0])
    return match.group(1) if match else None


BLOCKS = _python_blocks()


@pytest.mark.parametrize("where, code", BLOCKS, ids=[where for where, _ in BLOCKS])
def test_python_block_runs_as_written(where, code, tmp_path, monkeypatch):
    name = _skip_name(code)
    if name is not None:
        pytest.skip(f"{name}: {SKIPPED.get(name, 'not listed in SKIPPED (test_skipped_blocks_are_listed fails)')}")
    folder = _folder_name(code)
    if folder is not None:
        assert folder in PREPARED, f"{where}: no folder {folder!r} in PREPARED"
        PREPARED[folder](tmp_path)
    monkeypatch.chdir(tmp_path)  # anything a block writes stays in the test's folder
    exec(compile(code, where, "exec"), {"__name__": "__docs__"})


def test_skipped_blocks_are_listed_with_their_reason():
    marked = [name for _, code in BLOCKS if (name := _skip_name(code)) is not None]
    assert sorted(marked) == sorted(SKIPPED), "a block's skip marker and SKIPPED disagree"
    assert len(BLOCKS) - len(marked) >= 7  # the README's two, api.md's four, lra-reference.md's classifier


def test_prepared_folders_are_each_used_by_a_block():
    assert sorted({name for _, code in BLOCKS if (name := _folder_name(code)) is not None}) == sorted(PREPARED)


def test_cli_reference_is_what_the_parsers_generate():
    spec = importlib.util.spec_from_file_location("cli_doc", ROOT / "tools" / "docs" / "cli_doc.py")
    cli_doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli_doc)
    pages = cli_doc.render()
    assert cli_doc.stale(pages) == [], "stale: run python tools/docs/cli_doc.py"
    # the index and a page per subcommand, with a flag of each kind
    assert {path.relative_to(ROOT).as_posix() for path in pages} >= {
        "docs/cli.md", "docs/cli/train.md", "docs/cli/lra.md", "docs/cli/synth.md", "docs/cli/bench.md"}
    for anchor in ("## `spe train`", "## `spe lra`", "## `spe bench`"):  # anchors other pages link to
        assert anchor in pages[ROOT / "docs" / "cli.md"]
    assert "`--decay` {none,fixed,learned,gated,gated-channel}" in pages[ROOT / "docs" / "cli" / "train.md"]


def test_cli_reference_check_names_a_stale_page_and_an_orphan(tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("cli_doc", ROOT / "tools" / "docs" / "cli_doc.py")
    cli_doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli_doc)
    pages = {tmp_path / "cli.md": "index\n", tmp_path / "cli" / "train.md": f"{cli_doc.MARK}\ntrain\n"}
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli.md").write_text("index\n", encoding="utf-8")
    (tmp_path / "cli" / "train.md").write_text(f"{cli_doc.MARK}\nold\n", encoding="utf-8")
    (tmp_path / "cli" / "gone.md").write_text(f"{cli_doc.MARK}\ngone\n", encoding="utf-8")
    (tmp_path / "cli" / "notes.md").write_text("a page of someone's own\n", encoding="utf-8")
    monkeypatch.setattr(cli_doc, "PAGES", tmp_path / "cli")
    monkeypatch.setattr(cli_doc, "render", lambda: pages)
    assert cli_doc.stale(pages) == [tmp_path / "cli" / "train.md", tmp_path / "cli" / "gone.md"]
    monkeypatch.setattr(cli_doc, "ROOT", tmp_path)
    assert cli_doc.main(["--check"]) == 1
    assert "train.md is stale" in capsys.readouterr().out
    assert cli_doc.main([]) == 0
    # the stale page rewritten, the orphan it wrote removed, a page it did not write kept
    assert (tmp_path / "cli" / "train.md").read_text(encoding="utf-8").endswith("train\n")
    assert not (tmp_path / "cli" / "gone.md").exists()
    assert (tmp_path / "cli" / "notes.md").exists()
    assert cli_doc.main(["--check"]) == 0


# --- page lengths ---------------------------------------------------------------------------

# Study pages (findings first, then generated tables) may run to 400 lines; every other page
# under docs/, generated ones included, is a reference page of at most 300.
STUDY_PAGES = {"ablation.md", "gates.md", "learned-time.md", "learned-time-budgets.md", "learned-time-controls.md",
               "learned-time-method.md",
               "learned-time-results.md", "lra.md", "peers.md", "results.md", "tutorial-study.md"}
_DOCS = sorted((ROOT / "docs").rglob("*.md"))


def test_study_pages_exist():
    assert STUDY_PAGES <= {_rel(page).removeprefix("docs/") for page in _DOCS}


@pytest.mark.parametrize("page", _DOCS, ids=_rel)
def test_page_length(page):
    name = _rel(page).removeprefix("docs/")
    limit = 400 if name in STUDY_PAGES else 300
    lines = len(page.read_text(encoding="utf-8").splitlines())
    assert lines <= limit, f"{name}: {lines} lines, over the {limit} of a {'study' if limit == 400 else 'reference'} page"


# --- links ----------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _headings(text: str) -> list[tuple[int, str]]:
    """(level, text) of every heading outside fenced blocks."""
    text = _FENCE.sub("", text)
    return [(len(m.group(1)), m.group(2)) for m in re.finditer(r"^(#{1,6}) (.+)$", text, re.MULTILINE)]


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for _, heading in _headings(page.read_text(encoding="utf-8")):
        base = slug(heading)
        anchors.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return anchors


def test_slug_follows_github():
    assert slug("Bach chorales, L = 64, 30 held-out chorales of ≥ 1,025 tokens") == \
        "bach-chorales-l--64-30-held-out-chorales-of--1025-tokens"
    assert slug("The ListOps study's gated rows (bidirectional gates)") == \
        "the-listops-studys-gated-rows-bidirectional-gates"


def _links(page: Path) -> list[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link}: no heading with that anchor")
    assert not broken, broken


# --- the README -----------------------------------------------------------------------------

def test_readme_is_short_and_its_quick_start_is_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    quick = text.split("## Quick start", 1)[1]
    fence = _FENCE.search(quick)
    assert fence.group(1) == "bash"
    assert fence.group(2).strip().splitlines() == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def _cells(line: str) -> list[str]:
    return [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]


def _section(page: Path, anchor: str) -> str:
    """The text under the heading with this anchor, up to the next heading of its level or above."""
    lines, out, level = page.read_text(encoding="utf-8").splitlines(), None, 0
    for line in lines:
        m = re.match(r"^(#{1,6}) (.+)$", line)
        if m and out is not None and len(m.group(1)) <= level:
            break
        if m and out is None and slug(m.group(2)) == anchor:
            out, level = [], len(m.group(1))
        elif out is not None:
            out.append(line)
    assert out is not None, f"{page.name} has no heading #{anchor}"
    return "\n".join(out)


def test_every_row_of_the_readme_results_is_generated_from_committed_data():
    """README's main results hold no table row outside the generated block (whose rows
    tests/lab/test_study_tables.py keeps equal to docs/data): no number there is copied by hand."""
    text = README.read_text(encoding="utf-8").split("## Main results", 1)[1].split("\n## ", 1)[0]
    assert "<!-- table:readme-results -->" in text
    generated = re.search(r"<!-- table:readme-results -->(.*?)<!-- /table -->", text, flags=re.DOTALL).group(1)
    assert sum(line.startswith("| ") for line in generated.splitlines()) > 10
    outside = re.sub(r"<!-- table:readme-results -->.*?<!-- /table -->", "", text, flags=re.DOTALL)
    assert [line for line in outside.splitlines() if line.startswith("|")] == []


# --- docs/results.md: the paper's Table 6 beside ours ----------------------------------------

def test_table_6_growths_follow_from_their_columns():
    section = _section(ROOT / "docs" / "results.md", "the-papers-table-6-beside-ours")
    rows = [_cells(line) for line in section.splitlines() if line.startswith("| ") and "±" in line]
    assert len(rows) == 6
    for cells in rows:
        for within, beyond, growth in ((1, 2, 3), (4, 5, 6)):
            if cells[within] == "–":
                continue
            a, b = float(cells[within].split(" ±")[0]), float(cells[beyond].split(" ±")[0])
            assert cells[growth] == f"{100 * (b / a - 1):+.1f} %", cells


def test_our_side_of_table_6_is_the_reports_section_1():
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    report = _section(ROOT / "docs" / "results.md", "1-extrapolation-beyond-the-training-length-table-6-figure-3")
    ours = {"APE": "ape", "sineSPE (gated)": "sinespe", "sineSPE, ungated": "sinespe-ungated",
            "convSPE (gated)": "convspe", "convSPE, ungated": "convspe-ungated", "RoPE (not in the paper)": "rope"}
    report_rows = {cells[0]: cells for cells in map(_cells, report.splitlines()[2:]) if len(cells) == 5}
    table = _section(ROOT / "docs" / "results.md", "the-papers-table-6-beside-ours")
    for cells in (_cells(line) for line in table.splitlines() if line.startswith("| ") and "±" in line):
        within, beyond = report_rows[ours[cells[0]]][3:5]
        assert (cells[4], cells[5]) == (within, beyond), cells[0]
    # the intro that recipe.sh writes before the report is this page's
    assert text.startswith((ROOT / "tools" / "docs" / "results_intro.md").read_text(encoding="utf-8"))



# --- the renderers of docs/ -------------------------------------------------------------------

def _tool(name: str):
    import sys

    sys.path.insert(0, str(ROOT / "tools" / "docs"))  # the renderers import their siblings
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "docs" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "tools" / "docs"))


def test_bench_page_shows_no_machine_path(monkeypatch):
    portable = _tool("bench_doc").portable
    monkeypatch.chdir(ROOT)
    assert portable("spe bench --out /elsewhere/runs/bench_final --lengths 512") == \
        "spe bench --out runs/bench_final --lengths 512"
    assert portable(f"spe bench --json {ROOT}/x/b.json --out /tmp/b") == "spe bench --json x/b.json --out /tmp/b"
    page = (ROOT / "docs" / "bench" / "cpu.md").read_text(encoding="utf-8")
    assert str(ROOT) not in page and str(ROOT.parent) + "/" not in page  # no path of the machine it ran on


# --- spreads over seeds ---------------------------------------------------------------------

def _per_seed_rows() -> list[tuple[str, str, list[float]]]:
    """(page:line, "mean ± std" cell, per-seed values) of every table row with a per-seed column."""
    rows = []
    for page in PAGES:
        header = None
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if not line.startswith("|"):
                header = None
                continue
            cells = _cells(line)
            if "per seed" in cells:
                header = cells
                continue
            if header is None or cells[0].startswith("---"):
                continue
            seeds = cells[header.index("per seed")]
            spread = next((c for c in cells if re.fullmatch(r"\d+\.\d+ ± \d+\.\d+", c)), None)
            if spread and re.fullmatch(r"\d+\.\d+(, \d+\.\d+)+", seeds):
                rows.append((f"{_rel(page)}:{number}", spread, [float(v) for v in seeds.split(", ")]))
    return rows


def test_spreads_are_the_sample_std_of_the_seeds_printed_beside_them():
    import statistics

    rows = _per_seed_rows()
    assert len(rows) >= 60  # the ListOps study's and results' tables, the gated rows
    for where, spread, seeds in rows:
        mean, std = map(float, spread.split(" ± "))
        # per-seed values are printed to 0.1: the mean moves by at most 0.05, the sample std by
        # at most 0.05·√(n/(n − 1)) (< 0.065 for n ≥ 3); a population std (× √((n − 1)/n)) of a
        # spread above 0.4 is outside that
        assert abs(statistics.mean(seeds) - mean) <= 0.051, (where, spread, seeds)
        assert abs(statistics.stdev(seeds) - std) <= 0.065, (where, spread, seeds)

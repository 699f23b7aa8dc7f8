"""A study's Markdown tables and plot, generated from its committed data alone (:mod:`spe.lab.study_data`).

A doc holds a study's generated part between ``<!-- table:STUDY -->`` and ``<!-- /table -->``;
:func:`render_study` gives that part and :func:`replace_blocks` / :func:`drifted_blocks` write
or check it (``python tools/docs/study_tables.py``; a test keeps every committed block equal to
its data). The rules are :mod:`spe.lab.study_rules`'.

The part, per study:

* **Validation (selection)**: per row its window, seeds and parameters, mean ± sample std
  (n − 1) in the shown buckets (language models: [0, L), [3L, 4L), [15L, 16L) as far as the data
  go, and the last bucket if it is not among them; synthetic tasks: the lengths L, 4 L, 16 L,
  64 L present), the one-sided Welch p-value against the best in the first and last shown
  buckets (uncorrected, and Holm-adjusted in brackets where that differs), best-group cells
  (Holm's) in bold, the growth from the first to the last shown bucket
  (cross-entropy only: last / first − 1 per seed, then mean ± std) and the buckets where the
  row needs 5 seeds. Rows sorted by their mean in the last shown bucket, rows of one seed
  (untested) after the others.
* **Every other split (reported)**: the same rows in the same order, mean ± std and growth,
  no test and no mark: nothing is chosen on it.
* The best groups in words, each with its leave-one-seed-out stability
  (:func:`spe.lab.study_rules.leave_one_seed_out`) and, where Holm's correction changed it, the
  group of each test alone; the rows that need 5 seeds; the equivalence tests (TOST,
  :func:`spe.lab.study_rules.equivalent`) of the pairs of rows a doc's wording calls equivalent;
  the training tokens, and the plot (:func:`plot_study`).
"""

from __future__ import annotations

import math
import os
import re
import textwrap
from collections import defaultdict
from pathlib import Path

from spe.lab.stats import format_mean_std, mean_and_std
from spe.lab.study_rules import ALPHA, MARGINS, MORE_SEEDS, SELECTION_SPLIT, better, equivalent, \
    leave_one_seed_out, select

__all__ = ["BLOCK", "drifted_blocks", "growth_row", "image_link", "line_style", "plot_budgets", "plot_study",
           "render_budgets", "render_study", "replace_blocks", "shown_buckets", "study_blocks", "summary_row"]

BLOCK = re.compile(r"<!-- table:(?P<name>[A-Za-z0-9._-]+) -->\n(?P<body>.*?)<!-- /table -->", re.S)
SHOWN_MULTIPLES = {"cross_entropy": (0, 3, 15), "accuracy": (1, 4, 16, 64)}  # bucket starts / lengths, × L


def _values(records: list[dict]) -> dict:
    """split -> (start, end) -> variant -> seed -> value, finite values only (:func:`_not_finite`)."""
    table, seen = defaultdict(lambda: defaultdict(lambda: defaultdict(dict))), set()
    for r in records:
        key = (r["variant"], r["seed"], r["split"], r["bucket_start"], r["bucket_end"])
        if key in seen:  # the last would win unseen
            raise ValueError(f"two records of (variant, seed, split, bucket_start, bucket_end) = {key}: keep one")
        seen.add(key)
        if math.isfinite(r["value"]):
            table[r["split"]][r["bucket_start"], r["bucket_end"]][r["variant"]][r["seed"]] = r["value"]
    return table


def _not_finite(records: list[dict]) -> list[dict]:
    """The records whose value is not finite (``null`` in the data: a diverged run's cross-entropy):
    every mean, spread and test leaves them out, and the tables say how many."""
    return [r for r in records if not math.isfinite(r["value"])]


def shown_buckets(available: list[tuple[int, int]], metric: str, train_length: int) -> list[tuple[int, int]]:
    """The buckets a table shows: those starting at (cross-entropy) or of length (accuracy) 0, 3 L,
    15 L / L, 4 L, 16 L, 64 L that the data hold, then the last one held if it is not among them."""
    available = sorted(available)
    wanted = {m * train_length for m in SHOWN_MULTIPLES[metric]}
    shown = [b for b in available if b[0] in wanted]
    if available and available[-1] not in shown:
        shown.append(available[-1])
    return shown


def _label(bucket: tuple[int, int]) -> str:
    return f"[{bucket[0]},{bucket[1]})" if bucket[0] != bucket[1] else f"N = {bucket[0]:,}"


def _fmt(mean: float, std: float, metric: str) -> str:
    if metric == "accuracy":  # a fraction, shown in percent
        return format_mean_std(100 * mean, 100 * std, digits=1)
    return format_mean_std(mean, std, digits=3)


def _cell(values: list[float], metric: str) -> str:
    return _fmt(*mean_and_std(values), metric)


def _p(row, best: str | None) -> str:
    """The p cell: the uncorrected p, then the Holm-adjusted one in brackets where it reads otherwise."""
    if row.name == best:
        return "best"
    if row.p is None:
        return "–"

    def text(p: float) -> str:
        return "<0.001" if p < 1e-3 else f"{p:.3f}"

    raw, holm = text(row.p), text(row.p_holm)
    return raw if raw == holm else f"{raw} ({holm})"


def _seed_growths(by_bucket: dict, first, last, variant: str) -> list[float]:
    """``last / first − 1`` of ``variant`` per seed that has both buckets (seed order)."""
    a, b = by_bucket.get(first, {}).get(variant, {}), by_bucket.get(last, {}).get(variant, {})
    return [b[s] / a[s] - 1 for s in sorted(set(a) & set(b))]


def _growth_text(growths: list[float]) -> str:
    mean, std = mean_and_std(growths)
    return format_mean_std(100 * mean, 100 * std, digits=1, signed=True) + " %"


def _growth(by_bucket: dict, first, last, variant: str) -> str:
    growths = _seed_growths(by_bucket, first, last, variant)
    return "–" if not growths or first == last else _growth_text(growths)


def _order(rows: list[str], last: dict, metric: str) -> list[str]:
    """Rows of two seeds or more by their mean in the last bucket (best first), then rows of one
    seed (untested) likewise, then rows without a value there, in the order given."""
    sign = 1 if better(metric) == "lower" else -1
    scored = [n for n in rows if last.get(n)]
    ranked = sorted(scored, key=lambda n: (len(last[n]) < 2, sign * mean_and_std(last[n].values())[0]))
    return ranked + [n for n in rows if n not in ranked]


MIXED_MARK = " †"  # the mark of a row whose seeds ran on more than one commit or processor (or on one not recorded)


def _ran_on(record: dict) -> str:
    """``COMMIT`` (``+dirty`` for a tree with uncommitted changes) ``on CPU``: the code and the
    processor model, each of which moves a seed's numbers (docs/study-rules.md)."""
    return (record["commit"] + ("+dirty" if record.get("dirty") else "")
            + (f" on {record['cpu']}" if record.get("cpu") else ""))


def commits_by_seed(meta: dict, name: str, seeds) -> dict[int, str | None]:
    """Seed -> the commit and processor row ``name``'s run recorded (:func:`_ran_on`; None: no
    commit recorded), for ``seeds``."""
    by_seed = meta.get("provenance", {}).get(name, {})
    found = {}
    for seed in seeds:
        record = by_seed.get(str(seed), {})
        found[seed] = None if record.get("commit") is None else _ran_on(record)
    return found


def mixed_commits(meta: dict, by_bucket: dict, shown) -> dict[str, dict[int, str | None]]:
    """Rows whose seeds (those in ``shown`` buckets) do not share one recorded commit -> seed ->
    commit; empty when the meta holds no provenance at all (then :func:`render_study` says so once)."""
    if not meta.get("provenance"):
        return {}
    mixed = {}
    for name in {n for b in shown for n in by_bucket.get(b, {})}:
        seeds = sorted({s for b in shown for s in by_bucket.get(b, {}).get(name, {})})
        commits = commits_by_seed(meta, name, seeds)
        if None in commits.values() or len(set(commits.values())) > 1:
            mixed[name] = commits
    return mixed


def _provenance_line(meta: dict, by_bucket: dict, shown) -> str:
    if not meta.get("provenance"):
        return ("* Provenance: these runs recorded no commit (they were made before runs kept one), so their "
                "seeds cannot be tied to one code version.")
    mixed = mixed_commits(meta, by_bucket, shown)
    if not mixed:
        commits = {_ran_on(r) for by_seed in meta["provenance"].values() for r in by_seed.values() if r.get("commit")}
        return (f"* Provenance: each row's seeds ran on one commit and processor "
                f"({', '.join(sorted(c[:10] + c[40:] for c in commits))}); "
                "commit, configuration hash, threads, versions and host of every run are in the meta file.")
    def seeds(commits: dict) -> str:  # seeds grouped by commit, in the order of their first seed
        by_commit: dict[str | None, list[int]] = {}
        for s, c in sorted(commits.items()):
            by_commit.setdefault(c, []).append(s)
        return ", ".join(f"{_seed_list(s)}: {'not recorded' if c is None else c[:10] + c[40:]}"
                         for c, s in by_commit.items())

    unrecorded = sorted(n for n, commits in mixed.items() if set(commits.values()) == {None})
    rows = "; ".join(f"{n} ({seeds(commits)})" for n, commits in sorted(mixed.items()) if n not in unrecorded)
    said = [f"rows whose seeds ran on more than one commit or processor, or partly on one not recorded: {rows}"] if rows else []
    if unrecorded:
        said.append(f"rows with no commit recorded (runs made before runs kept one): {', '.join(unrecorded)}")
    return f"* Provenance:{MIXED_MARK} {'; '.join(said)}."


def _seed_list(seeds: list[int]) -> str:
    """'seed 3', 'seeds 3 and 4', 'seeds 0–4' (three or more consecutive), 'seeds 0, 2 and 4'."""
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return f"seeds {', '.join(map(str, seeds[:-1]))} and {seeds[-1]}"


def _selection_table(by_bucket, shown, groups, order, meta, params) -> list[str]:
    metric, unit = meta["metric"], "%" if meta["metric"] == "accuracy" else ""
    tested = set(groups)
    header = ["row", "window", "seeds", "params"]
    for b in shown:
        header.append(_label(b) + (f" {unit}" if unit else ""))
        if b in tested:
            header.append("p (Holm)")
    if metric == "cross_entropy":
        header.append("growth")
    header += [f"{MORE_SEEDS} seeds", "description"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    mixed = mixed_commits(meta, by_bucket, shown)
    for name in order:
        info = meta["rows"].get(name, {})
        seeds = sorted({s for b in shown for s in by_bucket.get(b, {}).get(name, {})})
        cells = [name + (MIXED_MARK if name in mixed else ""), info.get("window", ""), str(len(seeds)),
                 params.get(name, "")]
        near = []
        for b in shown:
            values = by_bucket.get(b, {}).get(name, {})
            text = _cell(list(values.values()), metric) if values else "–"
            sel = groups.get(b)
            row = sel.rows.get(name) if sel else None
            cells.append(f"**{text}**" if row is not None and row.in_group else text)
            if b in tested:
                cells.append(_p(row, sel.best) if row is not None else "–")
                if row is not None and name in sel.needs_seeds:
                    near.append(_label(b))
        if metric == "cross_entropy":
            cells.append(_growth(by_bucket, shown[0], shown[-1], name))
        cells += [", ".join(near), info.get("description", "")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _reported_table(by_bucket, shown, order, metric) -> list[str]:
    header = ["row", "seeds", *(_label(b) + (" %" if metric == "accuracy" else "") for b in shown)]
    if metric == "cross_entropy":
        header.append("growth")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in order:
        seeds = sorted({s for b in shown for s in by_bucket.get(b, {}).get(name, {})})
        if not seeds:
            continue
        cells = [name, str(len(seeds))]
        for b in shown:
            values = by_bucket.get(b, {}).get(name, {})
            cells.append(_cell(list(values.values()), metric) if values else "–")
        if metric == "cross_entropy":
            cells.append(_growth(by_bucket, shown[0], shown[-1], name))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _params(records: list[dict]) -> dict[str, str]:
    counts = defaultdict(set)
    for r in records:
        counts[r["variant"]].add(r["params"])
    return {n: "/".join(f"{c / 1e6:.2f} M" for c in sorted(v)) for n, v in counts.items()}


def _difference(value: float, metric: str, *, signed: bool = True) -> str:
    """A difference of two rows' means in the table's unit: nats (3 decimals) or accuracy points."""
    if metric == "accuracy":
        return f"{100 * value:{'+' if signed else ''}.1f}"
    return f"{value:{'+' if signed else ''}.3f}"


def equivalence_lines(validation: dict, buckets, pairs, meta: dict) -> list[str]:
    """One line per pair of rows (a, b): the TOST of a − b within ± the metric's margin
    (:data:`spe.lab.study_rules.MARGINS`) in each of ``buckets`` of the validation split, with the
    difference of means, its 90 % interval, p and the verdict ("equivalent" or "not shown
    equivalent"); "–" where a row has fewer than two seeds there.

    Raises:
        ValueError: naming the study and the row, for a row the data do not hold.
    """
    metric = meta["metric"]
    held = {n for by_row in validation.values() for n in by_row}
    unit = "points" if metric == "accuracy" else "nats"
    lines = []
    for a, b in pairs:
        for name in (a, b):
            if name not in held:
                raise ValueError(f"study {meta['study']!r}: the equivalence pair ({a}, {b}) names row {name!r}, "
                                 f"which its validation data do not hold")
        parts = []
        for bucket in buckets:
            va, vb = (list(validation.get(bucket, {}).get(n, {}).values()) for n in (a, b))
            if len(va) < 2 or len(vb) < 2:
                parts.append(f"at {_label(bucket)}: – (fewer than two seeds)")
                continue
            e = equivalent(va, vb, MARGINS[metric])
            verdict = "equivalent" if e.equivalent else "not shown equivalent"
            p = "p < 0.001" if e.p < 1e-3 else f"p = {e.p:.3f}"
            parts.append(f"at {_label(bucket)}: {_difference(e.difference, metric)} "
                         f"[{_difference(e.low, metric)}, {_difference(e.high, metric)}], {p}, {verdict}")
        margin = _difference(MARGINS[metric], metric, signed=False)
        lines.append(f"* Equivalence on validation, {a} − {b} (TOST within ± {margin} {unit}, {ALPHA} each side; "
                     "difference [90 % interval], p): " + "; ".join(parts) + ".")
    return lines


def render_study(records: list[dict], meta: dict, *, image: str | None = None,
                 equivalence: list[tuple[str, str]] | tuple = ()) -> str:
    """The study's generated Markdown (module docstring), ``image`` the plot's link if any,
    ``equivalence`` the pairs of rows whose equivalence the docs' wording rests on
    (:func:`equivalence_lines`).

    Values that are not finite are left out and counted (:func:`_not_finite`).

    Raises:
        ValueError: if the data hold no finite value on the validation split (nothing to select on),
            or an equivalence pair names a row the data do not hold.
    """
    metric, values = meta["metric"], _values(records)
    if SELECTION_SPLIT not in values:
        raise ValueError(f"study {meta['study']!r} holds no {SELECTION_SPLIT} split (no finite value on it): "
                         "its rows cannot be selected")
    validation = values[SELECTION_SPLIT]
    shown = shown_buckets(list(validation), metric, meta["train_length"])
    per_bucket = {b: {n: list(s.values()) for n, s in validation[b].items()}
                  for b in dict.fromkeys((shown[0], shown[-1]))}
    groups = {b: select(v, metric) for b, v in per_bucket.items()}
    # a plan's rows without runs (the longer-budget point runs four) are left out
    held = {r["variant"] for r in records}
    rows = [*(n for n in meta["rows"] if n in held), *sorted(held - set(meta["rows"]))]
    order = _order(rows, validation[shown[-1]], metric)
    what = ("cross-entropy (nats/token) by bucket of positions"
            if metric == "cross_entropy" else "accuracy (%) at each evaluated sequence length N")
    lines = [f"**{meta['title']}** ({meta['corpus_or_task']}; L = {meta['train_length']}).", "", "```bash",
             meta["command"], "```", "",
             f"Validation split (rows, repeats and best groups are chosen here): {what}, mean ± sample "
             "std (n − 1) over seeds; p (Holm): one-sided Welch test of the row being worse than the best, "
             "each test alone, and in brackets where it differs Holm's adjusted p over the k tests against "
             f"the best; **bold**: the best group (Holm-adjusted p ≥ {ALPHA}); {MORE_SEEDS} seeds: the buckets "
             "where the row's mean lies within one of its standard deviations of the mean at which its test "
             "alone would flip (docs/study-rules.md).", "",
             *_selection_table(validation, shown, groups, order, meta, _params(records)), ""]
    for split in sorted(s for s in values if s != SELECTION_SPLIT):
        split_shown = shown_buckets(list(values[split]), metric, meta["train_length"])
        lines += [f"{split.capitalize()} split (reported only; nothing is chosen on it), same rows and order:",
                  "",
                  *_reported_table(values[split], split_shown, order, metric), ""]
    for b, sel in groups.items():
        best = sel.rows.get(sel.best)
        note = f"best {sel.best}: {_fmt(best.mean, best.std, metric)}" if best else "no row of two seeds"
        alone = ("" if sel.uncorrected_group == sel.group
                 else f"; each test alone at {ALPHA} it would be {', '.join(sel.uncorrected_group)}")
        k = sel.comparisons
        lines.append(f"* Best group on validation at {_label(b)}, Holm over {k} test{'s' * (k != 1)}: "
                     f"{', '.join(sel.group) or '–'} ({note}); "
                     f"{leave_one_seed_out(per_bucket[b], metric).describe()}{alone}.")
    need = list(dict.fromkeys(n for sel in groups.values() for n in sel.needs_seeds))
    lines.append(f"* Rows to run at {MORE_SEEDS} seeds: {', '.join(need) if need else 'none'}.")
    lines += equivalence_lines(validation, list(groups), equivalence, meta)
    dropped = _not_finite(records)
    if dropped:
        named = ", ".join(f"{r['variant']} seed {r['seed']} {r['split']} {_label((r['bucket_start'], r['bucket_end']))}"
                          for r in dropped[:5])
        lines.append(f"* Values that are not finite (null in the data), left out of every cell and test: "
                     f"{len(dropped)} ({named}{', …' if len(dropped) > 5 else ''}).")
    tokens = sorted({r["train_tokens"] for r in records})
    lines.append("* Training tokens per run: " + ", ".join(f"{t:,}" for t in tokens) + ".")
    lines.append(_provenance_line(meta, validation, shown))
    if image:
        lines += ["", f"![{meta['study']}]({image})"]
    return "\n".join(lines) + "\n"


def _summary_values(records: list[dict], meta: dict, split: str) -> dict:
    """:func:`_values` of a summary's study; raises ValueError if it lacks ``split`` or validation."""
    values = _values(records)
    for s in (SELECTION_SPLIT, split):
        if s not in values:
            raise ValueError(f"study {meta['study']!r} has no {s!r} split (it has {sorted(values)})")
    return values


def _budget(records: list[dict]) -> str:
    """The training tokens of a run in millions, e.g. ``0.256 M`` (``A or B`` where runs differ)."""
    return " or ".join(f"{t / 1e6:.3g} M" for t in sorted({r["train_tokens"] for r in records}))


def summary_row(records: list[dict], meta: dict, *, question: str, split: str, rows: list[str], source: str,
                bucket: tuple[int, int] | None = None) -> str:
    """One row of a results summary (README's main results): ``| question, where | rows | source |``.

    The cell lists ``rows`` and every row of the best group on validation at ``bucket`` (default: the
    last shown bucket, 16 L or the longest length), each as mean ± sample std (n − 1) over its seeds on
    ``split`` with the seed count, best first by that split's mean; **bold**: the best group on
    validation (Holm's), whichever split is shown, so that the choice is never made on a test split.
    The question cell ends with what the figures hold under: the split, the bucket, the training
    tokens of a run and the test.

    Raises:
        ValueError: if the study has no such split or bucket, or a named row has no value there.
    """
    metric, values = meta["metric"], _summary_values(records, meta, split)
    validation = values[SELECTION_SPLIT]
    if bucket is None:
        bucket = shown_buckets(list(validation), metric, meta["train_length"])[-1]
    if bucket not in validation or bucket not in values[split]:
        raise ValueError(f"study {meta['study']!r} has no bucket {_label(bucket)} on {split!r} and {SELECTION_SPLIT!r}")
    sel = select({n: list(s.values()) for n, s in validation[bucket].items()}, metric)
    shown = values[split][bucket]
    missing = [n for n in rows if not shown.get(n)]
    if missing:
        raise ValueError(f"study {meta['study']!r} has no {split} value at {_label(bucket)} for rows {missing}")
    names = list(dict.fromkeys([*sel.group, *rows]))
    sign = 1 if better(metric) == "lower" else -1
    names.sort(key=lambda n: sign * mean_and_std(shown[n].values())[0])
    cells = []
    for n in names:
        text = f"{_cell(list(shown[n].values()), metric)} ({len(shown[n])})"
        cells.append(f"`{n}` " + (f"**{text}**" if n in sel.group else text))
    where = _label(bucket) if bucket[0] != bucket[1] else f"N = {bucket[0]:,} tokens"
    unit = "accuracy (%)" if metric == "accuracy" else "cross-entropy"
    return (f"| {question}: {unit} at {where}, {split} split; {_budget(records)} training tokens a run; "
            f"bold: best group on validation (Holm, {sel.comparisons} tests) | {', '.join(cells)} | {source} |")


def growth_row(records: list[dict], meta: dict, *, question: str, split: str, rows: list[str], source: str) -> str:
    """One row of a results summary on extrapolation: each row's growth of the metric from the
    first to the last shown bucket, ``last / first − 1`` per seed, then mean ± sample std (n − 1).

    The group in **bold** is the lowest-growth group on validation: the rules of
    :func:`spe.lab.study_rules.select` applied to the per-seed growths (one-sided Welch tests against
    the row of least growth, Holm's correction), whichever split is shown. Listed: ``rows`` and that
    group, by the shown split's mean growth, least first. Cross-entropy only (a growth of accuracy
    would reward a row that starts at chance).

    Raises:
        ValueError: if the metric is not cross-entropy, the study has no such split, fewer than two
            shown buckets, or a named row has no growth on the split.
    """
    metric = meta["metric"]
    if better(metric) != "lower":
        raise ValueError(f"study {meta['study']!r}: a growth summary needs a lower-is-better metric, not {metric!r}")
    values = _summary_values(records, meta, split)
    shown = shown_buckets(list(values[SELECTION_SPLIT]), metric, meta["train_length"])
    if len(shown) < 2:
        raise ValueError(f"study {meta['study']!r} shows one bucket only: no growth")
    first, last = shown[0], shown[-1]

    def growths(by_bucket: dict) -> dict[str, list[float]]:
        found = {n: _seed_growths(by_bucket, first, last, n) for n in by_bucket.get(first, {})}
        return {n: g for n, g in found.items() if g}

    sel = select(growths(values[SELECTION_SPLIT]), metric)
    reported = growths(values[split])
    missing = [n for n in rows if not reported.get(n)]
    if missing:
        raise ValueError(f"study {meta['study']!r} has no {split} growth from {_label(first)} to {_label(last)} "
                         f"for rows {missing}")
    names = sorted(dict.fromkeys([*sel.group, *rows]), key=lambda n: mean_and_std(reported[n])[0])
    cells = []
    for n in names:
        text = f"{_growth_text(reported[n])} ({len(reported[n])})"
        cells.append(f"`{n}` " + (f"**{text}**" if n in sel.group else text))
    return (f"| {question}: growth of the cross-entropy from {_label(first)} to {_label(last)}, {split} split; "
            f"{_budget(records)} training tokens a run; bold: least-growth group on validation "
            f"(Holm, {sel.comparisons} tests) | {', '.join(cells)} | {source} |")


def study_blocks(text: str) -> dict[str, str]:
    """Study name -> the body of its ``<!-- table:STUDY -->`` block in a doc's text."""
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def replace_blocks(text: str, bodies: dict[str, str]) -> str:
    """``text`` with the body of every block named in ``bodies`` replaced."""
    def body(m: re.Match) -> str:
        return f"<!-- table:{m['name']} -->\n{bodies.get(m['name'], m['body'])}<!-- /table -->"

    return BLOCK.sub(body, text)


def image_link(doc: Path, png: Path) -> str:
    """The plot's link as written in ``doc`` (relative to its folder, ``/`` separated)."""
    return Path(os.path.relpath(png, doc.parent)).as_posix()


def drifted_blocks(doc: Path, render) -> list[str]:
    """Names of the blocks of ``doc`` whose body differs from ``render(name, doc)``."""
    return [name for name, body in study_blocks(doc.read_text()).items() if body != render(name, doc)]


def line_style(i: int) -> tuple[str, str, str]:
    """(colour, line style, marker) of the ``i``-th row of a plot: the 10 dark then the 10 light
    colours of matplotlib's tab20, with 4 line styles and 7 markers cycling beside them, so that
    rows apart in the legend differ in more than one way (60 distinct triples at least)."""
    dark_light = (2 * i) % 20 + (i // 10) % 2
    return _TAB20[dark_light], ("-", "--", ":", "-.")[i % 4], "osv^DPX"[i % 7]


# matplotlib's tab20 (Vega's category20), dark/light pairs, as hex: no matplotlib import to name them
_TAB20 = ("#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd",
          "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d",
          "#17becf", "#9edae5")


#: lines of rows a panel of the plot holds at most (beside the best row, drawn in every panel)
PANEL_ROWS = 6


def row_family(name: str) -> str:
    """The family a study row is drawn with (one row of panels each), read from its name: PaTH
    and FoX (softmax with position in the data), the token shift, forget gates alone, sineSPE
    under a gate, sineSPE ungated, APE and RoPE, other rows."""
    words = name.split("-")
    if "path" in words or words[0] in ("fox", "foxpro"):
        return "PaTH and FoX"
    if "shift" in words:
        return "token shift of k and v"
    if words[0] == "gated":
        return "forget gates alone"
    if words[0] == "sinespe":
        return "sineSPE under a gate" if "gated" in words else "sineSPE, ungated"
    if words[0] in ("ape", "rope"):
        return "APE and RoPE"
    return "other rows"


def panel_groups(rows: list[str]) -> list[tuple[str, list[str]]]:
    """(family, rows) of each row of panels: ``rows`` grouped by :func:`row_family` in the order
    the families first appear, a family of more than :data:`PANEL_ROWS` rows cut into parts of
    at most that many (titled ``family (1/2)``, ...)."""
    families: dict[str, list[str]] = {}
    for name in rows:
        families.setdefault(row_family(name), []).append(name)
    groups = []
    for family, names in families.items():
        parts = [names[i:i + PANEL_ROWS] for i in range(0, len(names), PANEL_ROWS)]
        groups += [(family if len(parts) == 1 else f"{family} ({k}/{len(parts)})", part)
                   for k, part in enumerate(parts, 1)]
    return groups


def plot_study(records: list[dict], meta: dict, png: Path) -> dict[tuple[str, str], list[str]]:
    """Mean over seeds against position (bucket centre) or length, on a log axis: small
    multiples, one column of panels per split and one row per family of rows
    (:func:`panel_groups`, at most :data:`PANEL_ROWS` rows a panel), the best row on validation
    at the last shown bucket drawn in every panel (black, dashed) and the rows of its best group
    drawn thick. Writes ``png``.

    Returns:
        (family, split) -> the labels drawn in that panel.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values, metric = _values(records), meta["metric"]
    splits = [SELECTION_SPLIT, *sorted(s for s in values if s != SELECTION_SPLIT)]
    held = {r["variant"] for r in records}
    rows = [*(n for n in meta["rows"] if n in held), *sorted(held - set(meta["rows"]))]
    validation = values[SELECTION_SPLIT]
    last = shown_buckets(list(validation), metric, meta["train_length"])[-1]
    sel = select({n: list(s.values()) for n, s in validation[last].items()}, metric)
    best, group = sel.best, set(sel.group)
    scale = 100 if metric == "accuracy" else 1

    def curve(split: str, name: str) -> list[tuple[float, float]]:
        points = [((a + b) / 2, [v for v in values[split][a, b].get(name, {}).values() if math.isfinite(v)])
                  for a, b in sorted(values[split])]
        return [(x, mean_and_std(v)[0] * scale) for x, v in points if v]

    groups = panel_groups(rows)
    fig, axes = plt.subplots(len(groups), len(splits), figsize=(4.6 * len(splits) + 3.2, 2.7 * len(groups) + 0.6),
                             sharex="col", sharey=True, squeeze=False)
    drawn: dict[tuple[str, str], list[str]] = {}
    for (family, names), panels in zip(groups, axes):
        for ax, split in zip(panels, splits):
            labels = drawn.setdefault((family, split), [])
            if best is not None and best not in names and (points := curve(split, best)):
                ax.plot(*zip(*points), color="black", linestyle="--", linewidth=1.0, label=f"best: {best}")
                labels.append(f"best: {best}")
            for i, name in enumerate(names):
                if points := curve(split, name):
                    colour, style, marker = line_style(i)
                    label = f"{name} (best group)" if name in group else name
                    ax.plot(*zip(*points), color=colour, linestyle=style, marker=marker, markersize=3.5,
                            linewidth=2.6 if name in group else 1.2, label=label)
                    labels.append(label)
            ax.set_xscale("log", base=2)
            ax.axvline(meta["train_length"], color="grey", linewidth=0.8)
            ax.tick_params(labelsize=7)
        panels[0].set_ylabel(f"{family}\n" + ("nats/token" if metric == "cross_entropy" else "accuracy (%)"),
                             fontsize=8)
        panels[-1].legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for ax, split in zip(axes[0], splits):
        ax.set_title(f"{split}{' (selection)' if split == SELECTION_SPLIT else ' (reported)'}", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("token position (bucket centre, log scale)" if metric == "cross_entropy"
                      else "sequence length N (log scale)", fontsize=8)
    # a long title is wrapped to the figure's width (about 11 characters an inch at this size), not cut
    fig.suptitle(textwrap.fill(meta["title"], width=int(fig.get_figwidth() * 11)), fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=80)
    plt.close(fig)
    return drawn


def _budget_values(studies: list[tuple[list[dict], dict]]):
    """(budgets: train tokens -> its study or studies, values: split -> budget -> row -> seed -> value at
    the last shown bucket (16 L), the bucket), the splits in order (validation, the selection, first)."""
    budgets, values, bucket = {}, defaultdict(dict), None
    for records, meta in studies:
        table = _values(records)
        last = shown_buckets(list(table[SELECTION_SPLIT]), meta["metric"], meta["train_length"])[-1]
        if bucket not in (None, last):
            raise ValueError(f"study {meta['study']} ends at bucket {_label(last)}, the others at {_label(bucket)}: "
                             "compare budgets at one bucket")
        bucket = last
        tokens = {r["train_tokens"] for r in records}
        if len(tokens) != 1:
            raise ValueError(f"study {meta['study']} holds runs of {len(tokens)} budgets ({sorted(tokens)}): "
                             "one study per budget")
        budget = tokens.pop()
        found = {split: {n: dict(s) for n, s in by_bucket[last].items()} for split, by_bucket in table.items()}
        if budget in budgets:  # two studies of one budget (rows run later at the same steps): their rows join
            shared = sorted(set(found[SELECTION_SPLIT]) & set(values[SELECTION_SPLIT][budget]))
            if shared:
                raise ValueError(f"studies {budgets[budget]} and {meta['study']} both hold rows {shared} at "
                                 f"{budget} tokens: keep one")
            budgets[budget] += f" + {meta['study']}"
        else:
            budgets[budget] = meta["study"]
        for split, rows in found.items():
            values[split].setdefault(budget, {}).update(rows)
    splits = [SELECTION_SPLIT, *sorted(s for s in values if s != SELECTION_SPLIT)]
    return dict(sorted(budgets.items())), {s: values[s] for s in splits}, bucket


def render_budgets(studies: list[tuple[list[dict], dict]], rows: list[str]) -> list[str]:
    """The claims at several budgets: one study per budget (the same plan, protocol and bucket, more
    steps), ``rows`` compared at the last shown bucket (16 L). Per split (validation: selection;
    the others reported) a table of mean ± sample std (n − 1) per row and budget, the best-group
    cells (Holm's, among the rows run at that budget) in bold; then, in words, the best group at
    each budget with its leave-one-seed-out stability, and the rows in it at every budget.

    Raises:
        ValueError: if the studies end at different buckets, a study mixes budgets, or two studies of
            one budget hold the same row.
    """
    metric = studies[0][1]["metric"]
    budgets, values, bucket = _budget_values(studies)
    validation = values[SELECTION_SPLIT]
    groups, words = {}, []
    for budget, by_row in validation.items():
        present = {n: list(by_row[n].values()) for n in rows if by_row.get(n)}
        if len(present) < 2:
            continue
        sel = select(present, metric)
        groups[budget] = set(sel.group)
        words.append(f"- {budgets[budget]} ({budget:,} tokens): best {sel.best}; best group "
                     f"{', '.join(sel.group)} ({len(present)} rows run); leaving one seed out: "
                     f"{leave_one_seed_out(present, metric).describe()}.")
    full = [b for b in groups if all(validation[b].get(n) for n in rows)]
    always = [n for n in rows if full and all(n in groups[b] for b in full)]
    header = "| row | " + " | ".join(f"{b / 1e6:.2f} M tokens ({budgets[b]})" for b in budgets) + " |"
    lines = [f"Cross-entropy (nats/token) at {_label(bucket)}, mean ± sample std (n − 1) over seeds; "
             "bold: the best group at that budget (Holm's, among the rows run there)." if metric == "cross_entropy"
             else f"Accuracy at {_label(bucket)}, mean ± sample std (n − 1); bold: the best group at that budget."]
    for split, table in values.items():
        lines += ["", f"**{split}**{' (selection)' if split == SELECTION_SPLIT else ' (reported)'}", "", header,
                  "|---|" + "---|" * len(budgets)]
        for name in rows:
            cells = []
            for b in budgets:
                seeds = table.get(b, {}).get(name)
                text = _cell(list(seeds.values()), metric) + f" ({len(seeds)})" if seeds else "–"
                bold = split == SELECTION_SPLIT and seeds and name in groups.get(b, ())
                cells.append(f"**{text}**" if bold else text)
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "The seeds of each cell in brackets. Best groups on validation:", "", *words, ""]
    lines.append((f"In the best group at every budget where all {len(rows)} rows ran ({len(full)} of "
                  f"{len(budgets)}): {', '.join(always) if always else 'no row'}.") if full else
                 "No budget has every row: no row is said to hold at every budget.")
    return lines


def plot_budgets(studies: list[tuple[list[dict], dict]], rows: list[str], png: Path) -> None:
    """Mean ± sample std over seeds at the last shown bucket against training tokens (log scale), one
    line per row, validation (selection) and every other split side by side. Writes ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = studies[0][1]["metric"]
    budgets, values, bucket = _budget_values(studies)
    fig, axes = plt.subplots(1, len(values), figsize=(4.8 * len(values) + 2.6, 3.6), sharey=True, squeeze=False)
    for ax, (split, table) in zip(axes[0], values.items()):
        for i, name in enumerate(rows):
            points = [(b, mean_and_std(table[b][name].values())) for b in budgets if table.get(b, {}).get(name)]
            if points:
                colour, style, marker = line_style(i)
                xs = [b for b, _ in points]
                means = [m for _, (m, _) in points]
                spread = [0.0 if not math.isfinite(s) else s for _, (_, s) in points]
                ax.errorbar(xs, means, yerr=spread, color=colour, linestyle=style, marker=marker, markersize=4,
                            capsize=2, linewidth=1.4, label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{split}{' (selection)' if split == SELECTION_SPLIT else ' (reported)'}", fontsize=9)
        ax.set_xlabel("training tokens (log scale)", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel(f"{'nats/token' if metric == 'cross_entropy' else 'accuracy'} at {_label(bucket)}",
                          fontsize=8)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"{studies[0][1]['title'].split(',')[0]}: the claims at {len(budgets)} budgets", fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=80)
    plt.close(fig)

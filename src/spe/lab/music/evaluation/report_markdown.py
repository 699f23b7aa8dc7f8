"""Markdown of ``spe report``: one render function per section of :mod:`spe.lab.music.evaluation.report`.

Each takes the report document (what ``report.json`` holds) and returns Markdown lines.
"""

from __future__ import annotations

import math

from spe.encodings.registry import positional_spec
from spe.lab.music.evaluation.music_prompt import NUM_PARTS
from spe.lab.labels import run_label

__all__ = ["render_attention", "render_extrapolation", "render_generation", "render_header", "render_kernels",
           "render_pe_metrics", "render_r_grid", "render_report"]


def _fmt(value, digits: int = 3) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _fmt_mean_std(mean, std) -> str:
    """``mean ± std`` with 3 decimals; the mean alone when std is missing or NaN."""
    return _fmt(mean) + ("" if std is None or not math.isfinite(std) else f" ± {std:.3f}")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def _times_training_length(max_length: int, models: list[dict]) -> str:
    """'3 × the training length of 256' (or of the longest, when the models differ)."""
    longest = max(m["seq_len"] for m in models)
    which = "the training length" if len({m["seq_len"] for m in models}) == 1 else "the longest training length"
    return f"{max_length / longest:g} × {which} of {longest}"


def render_header(report: dict) -> list[str]:
    """The title, what was run and on which data."""
    models, summary = report["models"], report["extrapolation"]
    lines = ["# SPE report", "",
             f"Written {report['date']} by `spe report` (spe {report['spe_version']}) on {report['device']}.", "",
             "## What was run", ""]
    # the run's label names encoding, kernel, gate, decay, clock and window as it was trained
    lines += _table(["model", "checkpoint", "run", "R", "training length", "step"],
                    [[m["name"], f"`{m['checkpoint']}`", run_label(m["config"]),
                      str(m["config"]["num_realizations"]) if positional_spec(m["config"]["positional"]).stochastic else "–",
                      str(m["seq_len"]), str(m["step"])] for m in models])
    lines += ["", (f"Data: `{report['data']}`, validation split of the first checkpoint "
              f"({summary['num_validation_pieces']} pieces; {summary['num_sequences']} of them have the "
              f"{summary['max_length'] + 1} tokens that evaluation needs). "
              f"Evaluated positions: {summary['max_length']} ({_times_training_length(summary['max_length'], models)}; "
              "`--max-length`, default 2 × the longest training length)."), ""]
    return lines


def render_extrapolation(report: dict) -> list[str]:
    """Section 1: within / beyond the training length (Table 6, Figure 3)."""
    summary = report["extrapolation"]
    lines: list[str] = []
    lines += ["## 1. Extrapolation beyond the training length (Table 6, Figure 3)", "",
              ("Teacher-forced cross-entropy of the next token, in nats/token (lower is better), averaged over "
              "positions within the training length (0 ≤ t < L) and beyond it (L ≤ t < "
              f"{summary['max_length']}). ± is the standard deviation over validation sequences of each "
              "sequence's mean over those positions (n/a with a single sequence). A model that extrapolates "
              "keeps `beyond` close to `within`; the unigram row is the training token frequencies."), ""]
    rows = []
    for name, m in zip((m["name"] for m in report["models"]), summary["models"]):
        rows.append([name, m["label"], str(m["seq_len"]), _fmt_mean_std(m["within"], m.get("within_std")),
                     _fmt_mean_std(m["beyond"], m.get("beyond_std"))])
    # one unigram figure, over all evaluated positions: labelled so, not read as the within column
    rows.append([f"unigram (all {summary['max_length']} positions)", "–", "–", _fmt(summary["unigram"]), ""])
    lines += _table(["model", "run", "L", "within (nats/token)", "beyond (nats/token)"], rows)
    lines += ["", "![Cross-entropy by position](extrapolation/extrapolation.png)", "",
              "Per-position values: `extrapolation/per_position.csv`; buckets: `extrapolation/summary.json`.", ""]
    return lines


def render_pe_metrics(report: dict) -> list[str]:
    """Section 2: translation invariance T and monotonicity M (Table 7)."""
    lines: list[str] = []
    lines += ["## 2. Positional-encoding properties (Table 7)", "",
              ("Identical-token probing (Wang et al. 2021; appendix D.3): the first layer's unnormalised attention "
              "exp(q·k/√E) on a sequence repeating one token, for tokens evenly spaced over the vocabulary. "
              "**T** (translation invariance) is the share of the attention's variance not explained by the "
              "query-key offset; **M** (monotonicity) is the fraction of key pairs whose attention grows with the "
              "offset. Both lie in [0, 1], lower is better; each cell is the best head (head number in "
              "parentheses, from 1) of the per-head mean over the probe tokens. Columns: query positions "
              "[start, stop) and offsets m − n < N; queries at or beyond L are extrapolation. The ranges scale "
              "Table 7's (trained on 2048 tokens, queries up to 2560, offsets < 128/512/1024) to each training "
              "length L: probe length L + min(L, 512), queries [0, L) and [L, L + min(L, 512)), offsets "
              "< min(64, L) and < min(L, 512). The paper finds "
              "monotonicity of little relevance for music, and a position-blind head scores T = M = 0: read "
              "both together with the extrapolation table."), ""]
    for metric, title in (("T", "Translation invariance T (lower is better)"),
                          ("M", "Monotonicity M (lower is better)")):
        lines += [f"**{title}**", ""]
        rows, notes = [], []
        columns = None
        for name in (m["name"] for m in report["models"]):
            res = report["pe_metrics"][name]
            if "skipped" in res:
                notes.append(f"- {name}: skipped ({res['skipped']})")
                continue
            cells = res["columns"]
            if columns is None:
                columns = [(tuple(c["query_range"]), c["max_offset"]) for c in cells]
            # Models with other training lengths have other ranges: name them in the cells.
            same = [(tuple(c["query_range"]), c["max_offset"]) for c in cells] == columns
            rows.append([name, str(len(res["tokens"])), str(res["length"])] + [
                (f"{c[metric]['best']:.4f} (h{c[metric]['head'] + 1})" if same else
                 f"{c[metric]['best']:.4f} (h{c[metric]['head'] + 1}; q {c['query_range']}, "
                 f"o < {c['max_offset'] + 1})") for c in cells])
        if rows:
            width = max(len(r) for r in rows)
            header = ["model", "tokens", "probe length"] + [f"q ∈ [{a}, {b}), o < {o + 1}"
                                                             for (a, b), o in columns]
            header += [""] * (width - len(header))
            lines += _table(header, [r + [""] * (width - len(r)) for r in rows])
        lines += ["", *notes, ""] if notes else [""]
    return lines


def render_kernels(report: dict) -> list[str]:
    """Section 3: learned positional kernels (Figure 7)."""
    lines: list[str] = []
    lines += ["## 3. Learned positional kernels (Figure 7)", "",
              ("The effective kernel (1 − δ_d)·P_d(τ) + δ_d of the first layer for every head and feature d: "
              "P_d from the encoding's exact expected kernel, δ_d the layer's gate (0 when ungated). Red is "
              "positive, blue negative; a row that is flat at 1 is a feature the gate has switched off "
              "(position-blind). sineSPE is periodic in τ, convSPE vanishes beyond its filter length."), ""]
    if report["kernels"]:
        for name, png in report["kernels"].items():
            lines += [f"![{name} kernels]({png})", ""]
    else:
        lines += ["No SPE model among the checkpoints: nothing to show.", ""]
    return lines


def render_attention(report: dict) -> list[str]:
    """Section 4: attention maps (Figures 8-12)."""
    lines: list[str] = []
    lines += ["## 4. Attention maps (Figures 8-12)", "",
              ("Softmax attention of the first and the last layer on one validation sequence, computed offline "
              "from the queries and keys the kernel sees (q̂·k̂/√R with SPE, q·k/√D otherwise; a Performer "
              "approximates this matrix). Colour min{1, (a/0.02)^0.4} as in the paper; dashed lines: the "
              "training length. Attention piling up at the training length (APE) signals failed extrapolation."),
              ""]
    for name, png in report["attention"].items():
        lines += [f"- {name}: {png}" if png.startswith("skipped") else f"![{name} attention]({png})", ""]
    return lines


def render_generation(report: dict) -> list[str]:
    """Section 5: generation and style similarity (Figure 5)."""
    gen = report["generation"]
    p = gen["prompt"]
    lines: list[str] = []
    lines += ["## 5. Generation and style similarity (Figure 5)", "",
              (f"Prompt: the first {p['bars']} bars of validation piece #{p['validation_piece']} "
              f"({p['tokens']} tokens, {p['notes']} notes; [{p['midi']}]({p['midi']})). Each model continues it "
              f"with {gen['length']} tokens (nucleus sampling, top-p 0.9, temperature 1.2, seed {gen['seed']}). "
              f"The continuation after the prompt is cut into {NUM_PARTS} parts of equal duration, and each part's "
              "style profiles (onset-duration and time-pitch histograms, appendix C.2) are compared with the "
              "prompt's by cosine similarity: higher means closer to the prompt's style, and a drop in later "
              "parts means the model drifts as the piece grows past the training length."), ""]
    rows = []
    for s in gen["style"]:
        info = gen["models"][s["label"]]
        rows.append([s["label"], str(info["notes"]), f"{s['beats']:.1f}",
                     " / ".join(_fmt(v) for v in s["onset_duration"]),
                     " / ".join(_fmt(v) for v in s["time_pitch"])])
    lines += _table(["model", "notes", "continuation (beats)", f"onset-duration, parts 1–{NUM_PARTS}",
                     f"time-pitch, parts 1–{NUM_PARTS}"], rows)
    lines += ["", "![Style similarity](figures/style-similarity.png)", ""]
    for name, info in gen["models"].items():
        audio = f", audio: [{info['audio']}]({info['audio']})" if info["audio"] else ""
        lines += [(f"**{name}**: [{info['midi']}]({info['midi']}){audio}, {info['total_tokens']} tokens, "
                  f"{info['bars']} bars, {info['beats']:.1f} beats (dashed line: end of the prompt)"), "",
                  f"![{name} piano roll]({info['piano_roll']})", ""]
    lines += [f"Audio: {gen['audio']}.", ""]
    return lines


def render_r_grid(report: dict) -> list[str]:
    """Section 6: the R ablation (Figure 14)."""
    r = report["r_grid"]
    lines: list[str] = []
    lines += ["## 6. Number of realisations R (Figure 14)", ""]
    if not r["test"]:
        lines += ["Not run (give `--r-test`, e.g. `--r-test 8,32,64`).", ""]
    elif r["note"]:
        lines += [r["note"] + ".", ""]
    else:
        lines += [("Cross-entropy (nats/token, lower is better) of each SPE model evaluated with R_test "
                  "realisations, rows grouped by the R it was trained with (checkpoints sharing both are "
                  "averaged). Bold in the figures: R_test = R_train."), ""]
        for grid in r["grids"]:
            lines += [f"**{grid['label']}**", ""]
            header = ["R_train \\ R_test"] + [str(t) for t in grid["test"]]
            for key in ("within", "beyond"):
                lines += [f"{key} the training length:", ""]
                lines += _table(header, [[str(rt)] + [_fmt(v) for v in row]
                                         for rt, row in zip(grid["trained"], grid[key])])
                lines += [""]
            lines += [f"![R grid {grid['label']}]({grid['figure']})", ""]
    return lines


def render_report(report: dict) -> list[str]:
    """The whole ``report.md``, section by section."""
    lines = []
    for render in (render_header, render_extrapolation, render_pe_metrics, render_kernels, render_attention,
                   render_generation, render_r_grid):
        lines += render(report)
    return lines

"""Whole-model benchmark: one AdamW step of the main job's DecoderLM per positional encoding,
and the longest length whose training step fits in a memory budget.

Letters: B = batch, N = sequence length (tokens), MB = 2^20 bytes.

Each measurement runs in its own process (:mod:`spe.lab.bench.worker`). Variants are measured
in rounds that cycle through them (ape, sinespe, convspe, ape, sinespe, …), so a change in
the machine's load hits every variant alike; times are compared as ratios to APE.
"""

from __future__ import annotations

import logging
import math
import statistics
import sys

import torch

from spe.attention.layer import ATTENTIONS
from spe.lab.bench.run import parse_series, run_case, series_name
from spe.lab.bench.targets import record_decay, takes_decay

__all__ = ["extrapolate_longest", "longest_length", "merge_rounds", "parse_longest", "parse_shapes", "run_model_rounds"]

log = logging.getLogger(__name__)


def remi_vocab_size() -> int:
    """Vocabulary of the REMI tokenizer used for music (300 if MidiTok is not installed)."""
    try:
        from spe.lab.music.corpus import make_tokenizer
    except ImportError:
        return 300
    return len(make_tokenizer())


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"8x2048,2x8192"`` → [(8, 2048), (2, 8192)] (batch × length).

    Raises:
        ValueError: on an entry that is not two positive integers joined by ``x``.
    """
    shapes = []
    for entry in (e.strip() for e in text.split(",")):
        parts = entry.split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--model-shapes takes BATCHxLENGTH entries such as 8x2048,2x8192, got {text!r}")
        shapes.append((int(parts[0]), int(parts[1])))
    return shapes


def parse_longest(text: str, default_attention: str) -> list[tuple[str, str, str]]:
    """``"ape,sinespe,ape+softmax"`` → (positional, impl, attention) triples; an entry without
    ``+ATTENTION`` uses ``default_attention`` (the model config's).

    Raises:
        ValueError: on an unknown encoding name (as :func:`spe.lab.bench.run.parse_series`) or attention.
    """
    out = []
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        name, _, attention = entry.partition("+")
        if attention and attention not in ATTENTIONS:
            raise ValueError(f"--longest: attention after '+' must be one of {', '.join(ATTENTIONS)}, got {entry!r}")
        (pos, impl), = parse_series(name)
        out.append((pos, impl, attention or default_attention))
    if not out:
        raise ValueError(f"--longest takes a comma-separated list such as ape,sinespe,ape+softmax, got {text!r}")
    return out


def _model_case(common: dict, pos: str, impl: str, attention: str, batch: int, length: int,
                decay: str | None = None) -> dict:
    case = {**common, "mode": "model", "positional": pos, "impl": impl, "attention": attention, "batch": batch,
            "length": length}
    if decay is not None:  # else the model options' own (``--config``'s) decay
        case["decay"] = decay
    return case


def run_model_rounds(common: dict, series: list[tuple[str, str, str]], shapes: list[tuple[int, int]],
                     rounds: int, timeout: float, progress: bool = True,
                     compiled: tuple[bool, ...] = (False,), decays: list[str] | None = None) -> list[dict]:
    """One record per (shape, round, series, decay, compiled), the series cycled within each round.

    ``common`` holds the worker's case fields (model options, vocab_size, repeats, threads,
    device, max_seconds); ``compiled`` (False, True) measures every series eager and with
    ``torch.compile`` (the first, compiling step is the untimed warm-up); ``decays``
    (e.g. ``["none", "fixed"]``) measures every linear-kernel series once per decay mode
    (softmax once, without; None: the model options' decay). Returns the raw records;
    :func:`merge_rounds` pools them.
    """
    cases = [(s, d) for s in series for d in (decays or [None])
             if d in (None, "none") or takes_decay(s[2], d)]
    records = []
    total, done = len(shapes) * rounds * len(cases) * len(compiled), 0
    for batch, length in shapes:
        for rnd in range(rounds):
            for ((pos, impl, attention), decay), flag in ((s, c) for s in cases for c in compiled):
                done += 1
                case = {**_model_case(common, pos, impl, attention, batch, length, decay), "round": rnd}
                rec = run_case({**case, "compiled": True} if flag else case, timeout=timeout)
                records.append(rec)
                if progress:
                    state = rec.get("skipped") or f"{rec['median_ms']:.0f} ms, {rec['peak_mb']:.0f} MB"
                    name = (series_name(pos, impl) + ("" if decay in (None, "none") else f" decay {decay}")
                            + (" compiled" if flag else ""))
                    print(f"[{done}/{total}] model {name:16s} {attention:9s} B={batch} N={length} "
                          f"round {rnd}: {state}", file=sys.stderr, flush=True)
    return records


def merge_rounds(records: list[dict]) -> list[dict]:
    """Pools the rounds of each (series, attention, batch, length, compiled): the median of every
    timed step, the largest peak memory, and the ratios to APE with the same attention, shape and
    compilation, without decay (so that a decay row reads as its whole cost)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["positional"], r["impl"], r["attention"], r["batch"], r["length"],
                           bool(r.get("compiled")), record_decay(r)), []).append(r)
    merged = []
    for key, recs in groups.items():
        ok = [r for r in recs if "median_ms" in r]
        if not ok:
            merged.append({**recs[0], "rounds": 0})
            continue
        times = [t for r in ok for t in r.get("times_ms", [r["median_ms"]])]
        merged.append({**ok[0], "median_ms": statistics.median(times), "times_ms": times,
                       "peak_mb": max(r["peak_mb"] for r in ok), "rounds": len(ok),
                       "tokens_per_s": key[3] * key[4] / (statistics.median(times) / 1000)})
    for r in merged:
        base = next((a for a in merged if (a["positional"], a["attention"], a["batch"], a["length"],
                                           bool(a.get("compiled")), record_decay(a))
                     == ("ape", r["attention"], r["batch"], r["length"], bool(r.get("compiled")), "none")
                     and a.get("rounds")), None)
        if base and r.get("rounds"):
            r["time_vs_ape"] = r["median_ms"] / base["median_ms"]
            r["memory_vs_ape"] = r["peak_mb"] / max(base["peak_mb"], 1e-9)
    return merged


def _poly_fit(points: list[tuple[int, float]], degree: int) -> list[float]:
    """Least-squares coefficients [a, b(, c)] of a + b·N (+ c·N²) through (N, MB) points; with
    fewer points than coefficients, the highest terms are dropped (one point: a line through 0)."""
    if len(points) == 1:
        return [0.0, points[0][1] / points[0][0]]
    degree = min(degree, len(points) - 1)
    xs = torch.tensor([float(x) for x, _ in points], dtype=torch.float64)
    design = torch.stack([xs**k for k in range(degree + 1)], dim=1)
    ys = torch.tensor([float(y) for _, y in points], dtype=torch.float64)[:, None]
    return torch.linalg.lstsq(design, ys).solution[:, 0].tolist()


def _solve_budget(coef: list[float], budget_mb: float) -> int | None:
    """The largest N ≥ 0 with a + b·N (+ c·N²) = budget, or None when memory does not grow."""
    a, b, c = (coef + [0.0])[:3]
    if abs(c) < 1e-18:
        root = (budget_mb - a) / b if b > 0 else None
    else:
        disc = b * b - 4 * c * (a - budget_mb)
        root = (-b + math.sqrt(disc)) / (2 * c) if disc >= 0 and c > 0 else None
    return None if root is None else math.floor(root + 1e-6)  # a least-squares root lands a hair off integers


def _predict(points: list[tuple[int, float, float]], n: int, degree: int) -> float:
    coef = _poly_fit([(x, m) for x, m, _ in points[-3:]], degree)
    return sum(c * n**k for k, c in enumerate(coef))


def extrapolate_longest(points: list[tuple[int, float, float]], attention: str,
                        budget_mb: float) -> tuple[int | None, dict]:
    """(longest N, fit) from measured (N, total MB, step ms) points: a least-squares line
    a + b·N through the upper half of the range (the last two doublings), or for softmax,
    whose scores may be formed, a + b·N + c·N² through the last three; when that fit has no
    positive N² term (e.g. a kernel that never forms the scores), the line instead."""
    degree = 2 if attention == "softmax" else 1
    last = points[-1][0]
    upper = [(x, m) for x, m, _ in points if x * 2 ** (degree + 1) > last]
    coef = _poly_fit(upper, degree)
    if len(coef) > 2 and coef[2] <= 0:
        upper = [(x, m) for x, m, _ in points if x * 4 > last]
        coef = _poly_fit(upper, 1)
    return _solve_budget(coef, budget_mb), {"coefficients_mb": coef, "points": [x for x, _ in upper]}


def _bisect(measure, lo: int, hi: int, budget_mb: float, points: list) -> int:
    """The longest N in [lo, hi) found fitting ``budget_mb``, to 1/16 of ``lo`` (finer than
    the 10 % target needs); measured points are appended to ``points``."""
    while hi - lo > max(lo // 16, 1):
        mid = (lo + hi) // 2
        rec = measure(mid)
        ok = "median_ms" in rec and rec["base_mb"] + rec["peak_mb"] <= budget_mb
        if "median_ms" in rec:
            points.append((mid, rec["base_mb"] + rec["peak_mb"], rec["median_ms"]))
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def longest_length(common: dict, pos: str, impl: str, attention: str, *, budget_mb: float, measure_limit_mb: float,
                   start: int = 4096, max_step_s: float = 60.0, timeout: float = 600.0, measure=None,
                   progress: bool = False) -> dict:
    """The longest N at batch 1 whose AdamW step fits in ``budget_mb`` (the process's whole
    resident set: its base plus the step's growth).

    Each point is one (first) AdamW step in a fresh process. Doubles N from ``start`` while the next point's predicted memory stays under
    ``measure_limit_mb`` and its predicted step time under ``max_step_s`` (time ∝ N, N² for
    softmax), then bisects between the last point that fit and the first that did not when
    both were measured. When the budget lies beyond what may be measured, N is extrapolated
    from a least-squares line a + b·N through the measured points of the upper half of the
    range (peak memory is about linear in N for linear attention; a + b·N + c·N² through the
    last three points for softmax, whose scores may be formed), and the record says so.

    Args:
        measure: ``case -> record`` (default :func:`spe.lab.bench.run.run_case`); tests pass a model.

    Returns:
        {"positional", "impl", "attention", "points": [(N, total MB, step ms)], "longest",
        "extrapolated", "fit": {"a_mb", "mb_per_token", "points"} or None, "why"}.
    """
    run = measure or (lambda case: run_case(case, timeout=timeout))

    def measure(case: dict) -> dict:
        rec = run(case)
        if progress:
            state = rec.get("skipped") or f"{rec['base_mb'] + rec['peak_mb']:.0f} MB, {rec['median_ms']:.0f} ms"
            print(f"longest {series_name(pos, impl)} + {attention} N={case['length']}: {state}", file=sys.stderr,
                  flush=True)
        return rec

    points: list[tuple[int, float, float]] = []
    n, too_big = start, None
    while True:
        rec = measure({**_model_case(common, pos, impl, attention, 1, n), "repeats": 0})
        if "median_ms" not in rec:
            why = f"N={n}: {rec.get('skipped', 'failed')}"
            break
        total = rec["base_mb"] + rec["peak_mb"]
        points.append((n, total, rec["median_ms"]))
        if total > budget_mb:
            too_big = n
            why = "measured"
            break
        grow = 4 if attention == "softmax" else 2
        degree = 2 if attention == "softmax" else 1
        if _predict(points, 2 * n, degree) > measure_limit_mb:
            why = (f"N={2 * n} predicted {_predict(points, 2 * n, degree):.0f} MB > {measure_limit_mb:.0f} MB "
                   "measurable here")
            break
        if rec["median_ms"] * grow / 1000 > max_step_s:  # one (first) step per point
            why = f"N={2 * n} predicted {rec['median_ms'] * grow / 1000:.0f} s > {max_step_s:.0f} s"
            break
        n *= 2
    result = {"positional": pos, "impl": impl, "attention": attention, "points": points, "fit": None,
              "extrapolated": False, "why": why}
    fits = [x for x, m, _ in points if m <= budget_mb]
    if too_big is not None and fits:
        result["longest"] = _bisect(lambda n: measure({**_model_case(common, pos, impl, attention, 1, n),
                                                      "repeats": 0}), fits[-1], too_big, budget_mb, points)
        return result
    if not points:
        result["longest"] = None
        return result
    result["longest"], result["fit"] = extrapolate_longest(points, attention, budget_mb)
    result["extrapolated"] = True
    log.info("%s: longest N extrapolated to %s (%s)", series_name(pos, impl), result["longest"], result["fit"])
    return result

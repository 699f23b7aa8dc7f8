"""The engine's performance targets, read from one ``spe bench`` run: measured value and verdict.

Each row is (target, measured, verdict) with verdict ``met``, ``missed`` or ``not measured``
(the run did not include the cases the target needs). Ratios are taken within the run
(variants of one run share the machine's load); times are medians, memory the peak growth of
the process's resident set (``spe.lab.bench.worker``).

Letters: B = batch, N = sequence length (tokens).
"""

from __future__ import annotations

import math


__all__ = ["TARGETS", "find_record", "record_decay", "takes_decay", "target_rows", "targets_markdown"]

# (name, limit) of every target; "≤" limits for ratios, "≥" for the others (see target_rows).
TARGETS = {
    "model_sine_time": 1.05, "model_sine_memory": 1.1, "model_conv_time": 1.2, "model_conv_memory": 1.2,
    "longest_within": 0.10, "longest_min": 65536, "layer_reference_memory": 10.0, "layer_conv_time": 4.0,
    "linear_vs_sdpa": 3.0, "exponent": 1.1, "generation_flat": 1.2,
}


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "missed")


def takes_decay(attention: str, decay: str = "fixed") -> bool:
    """Whether a bench attention takes decay mode ``decay``, as its kernel spec says (the linear
    kernels take every constant decay, softmax only the FoX gate); other packages' layers
    (``spe.lab.bench.peers``) are no kernel of the registry and take none."""
    from spe.attention.kernels import KERNELS
    from spe.attention.layer import DECAY_FORM

    spec = KERNELS.get(attention)
    return spec is not None and decay in DECAY_FORM and spec.takes_decay(DECAY_FORM[decay])


def record_decay(r: dict) -> str:
    """The decay a record was measured with: ``none`` for softmax and other packages' layers (they
    take none); a record without its own (written before decay was a per-case field) has its
    model options' (``--modes model``) or none."""
    decay = r.get("decay", (r.get("model") or {}).get("decay", "none"))
    return decay if takes_decay(r["attention"], decay) else "none"


def find_record(records: list[dict], mode: str, pos: str, impl: str, att: str, n: int,
                decay: str = "none") -> dict | None:
    """The measured record of (mode, positional, impl, attention, length, decay), or None (absent or skipped);
    full attention's (a block-local record, ``attention_blocks``, is no baseline)."""
    for r in records:
        if (r["mode"], r["positional"], r["impl"], r["attention"], r["length"]) == (mode, pos, impl, att, n) \
                and record_decay(r) == decay and "median_ms" in r and not r.get("attention_blocks"):
            return r
    return None


def _model_rows(model: list[dict]) -> list[tuple[str, str, str]]:
    rows = []
    for pos, name, t_lim, m_lim in [("sinespe", "sineSPE (default, auto)", TARGETS["model_sine_time"],
                                     TARGETS["model_sine_memory"]),
                                    ("convspe", "convSPE", TARGETS["model_conv_time"], TARGETS["model_conv_memory"])]:
        default = "-" if pos == "sinespe" else "fft"
        for shape in [(8, 2048), (2, 8192)]:
            r = next((x for x in model if (x["positional"], x["impl"], x["batch"], x["length"]) == (pos, default, *shape)
                      and "time_vs_ape" in x), None)
            target = f"whole model, {shape[0]} × {shape[1]:,}: {name} ≤ {t_lim}× APE time, ≤ {m_lim}× memory"
            if r is None:
                rows.append((target, "–", _verdict(None)))
                continue
            chose = f" (auto → {r['resolved_impl']})" if r.get("resolved_impl") else ""
            measured = f"{r['time_vs_ape']:.2f}× time, {r['memory_vs_ape']:.2f}× memory{chose}"
            ok_t, ok_m = r["time_vs_ape"] <= t_lim, r["memory_vs_ape"] <= m_lim
            verdict = "met" if ok_t and ok_m else f"time {_verdict(ok_t)}, memory {_verdict(ok_m)}"
            rows.append((target, measured, verdict))
    return rows


def _longest_rows(longest: list[dict]) -> list[tuple[str, str, str]]:
    by = {(r["positional"], r["attention"]): r for r in longest if r.get("longest")}
    ape = next((r for (p, a), r in by.items() if p == "ape" and a != "softmax"), None)
    rows = []
    for pos in ("sinespe", "convspe"):
        r = next((x for (p, a), x in by.items() if p == pos), None)
        target = (f"longest length at batch 1 in 16 GB: {pos} within {TARGETS['longest_within']:.0%} of APE's "
                  f"and ≥ {TARGETS['longest_min']:,}")
        if r is None or ape is None:
            rows.append((target, "–", _verdict(None)))
            continue
        frac = r["longest"] / ape["longest"]
        how = "extrapolated" if r.get("extrapolated") else "measured"
        measured = f"{r['longest']:,} vs APE {ape['longest']:,} ({frac - 1:+.0%}; {how})"
        rows.append((target, measured, _verdict(frac >= 1 - TARGETS["longest_within"]
                                                and r["longest"] >= TARGETS["longest_min"])))
    soft = next((x for (p, a), x in by.items() if a == "softmax"), None)
    if soft is not None:
        rows.append(("longest length: softmax (reported, no target)",
                     f"{soft['longest']:,} ({'extrapolated' if soft.get('extrapolated') else 'measured'} by memory)",
                     "–"))
    return rows


def _layer_rows(records: list[dict]) -> list[tuple[str, str, str]]:
    rows = []
    ref = find_record(records, "train", "sinespe", "reference", "performer", 4096)
    ape = find_record(records, "train", "ape", "-", "performer", 4096)
    for impl in ("fused", "blocked"):
        fast = find_record(records, "train", "sinespe", impl, "performer", 4096)
        target = (f"one layer, B = 2, N = 4,096: {impl} sineSPE ≥ {TARGETS['layer_reference_memory']:.0f}× less "
                  "memory than the reference (the straightforward form)")
        if ref is None or fast is None:
            rows.append((target, "–", _verdict(None)))
            continue
        whole = ref["peak_mb"] / max(fast["peak_mb"], 1e-9)
        measured = f"whole layer {whole:.1f}× ({ref['peak_mb']:,.0f} vs {fast['peak_mb']:,.0f} MB)"
        ok = whole >= TARGETS["layer_reference_memory"]
        if ape is not None:  # what the SPE step itself adds over the same layer with APE
            added = (ref["peak_mb"] - ape["peak_mb"]) / max(fast["peak_mb"] - ape["peak_mb"], 1.0)
            measured += (f"; SPE's own memory (over APE + Performer's {ape['peak_mb']:,.0f} MB) "
                         f"{added:.1f}× less")
            ok = added >= TARGETS["layer_reference_memory"]
        rows.append((target, measured, _verdict(ok)))
    conv = find_record(records, "train", "convspe", "fft", "performer", 4096)
    target = f"one layer, N = 4,096: convSPE + Performer ≤ {TARGETS['layer_conv_time']:.0f}× APE + Performer time"
    rows.append((target, "–", _verdict(None)) if conv is None or ape is None else
                (target, f"{conv['median_ms'] / ape['median_ms']:.2f}×",
                 _verdict(conv["median_ms"] / ape["median_ms"] <= TARGETS["layer_conv_time"])))
    lin, soft = (find_record(records, "train", "ape", "-", att, 8192) for att in ("linear-elu", "softmax"))
    lin = lin or find_record(records, "train", "ape", "-", "linear", 8192)  # runs that named linear-elu "linear"
    target = f"one layer, N = 8,192: chunked causal linear attention ≥ {TARGETS['linear_vs_sdpa']:.0f}× faster than SDPA causal softmax"
    rows.append((target, "–", _verdict(None)) if lin is None or soft is None else
                (target, f"{soft['median_ms'] / lin['median_ms']:.2f}×",
                 _verdict(soft["median_ms"] / lin["median_ms"] >= TARGETS["linear_vs_sdpa"])))
    a, b = (find_record(records, "train", "sinespe", "-", "performer", n) for n in (1024, 16384))
    target = f"one layer: causal sineSPE + Performer time exponent ≤ {TARGETS['exponent']} from N = 1,024 to 16,384"
    if a is None or b is None:
        rows.append((target, "–", _verdict(None)))
    else:
        exp = math.log(b["median_ms"] / a["median_ms"]) / math.log(16384 / 1024)
        rows.append((target, f"{exp:.2f}", _verdict(exp <= TARGETS["exponent"])))
    for pos, impl in [("sinespe", "-"), ("convspe", "fft")]:
        g0, g1 = (find_record(records, "generate", pos, impl, "performer", n) for n in (512, 16384))
        target = f"generation per token flat: {pos} + Performer at N = 16,384 ≤ {TARGETS['generation_flat']}× N = 512"
        rows.append((target, "–", _verdict(None)) if g0 is None or g1 is None else
                    (target, f"{g1['median_ms'] / g0['median_ms']:.2f}× ({g0['median_ms']:.1f} → {g1['median_ms']:.1f} ms)",
                     _verdict(g1["median_ms"] / g0["median_ms"] <= TARGETS["generation_flat"])))
    return rows


def target_rows(payload: dict) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for every target, from a ``spe bench`` JSON payload
    (``records``, and ``model`` / ``longest`` when the run had them)."""
    return (_model_rows(payload.get("model") or []) + _longest_rows(payload.get("longest") or [])
            + _layer_rows(payload.get("records") or []))


def targets_markdown(payload: dict) -> list[str]:
    """The targets as a Markdown table (lines)."""
    lines = ["### Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in target_rows(payload)]
    return [*lines, ""]

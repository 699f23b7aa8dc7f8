"""Markdown tables of the whole-model benchmark (:mod:`spe.lab.bench.model`).

Letters: B = batch, N = sequence length (tokens), MB = 2^20 bytes.
"""

from __future__ import annotations

from spe.lab.bench.targets import record_decay

__all__ = ["cost_row", "longest_lines", "model_lines"]


def _name(r: dict) -> str:
    impl = r["impl"]
    if r["positional"] == "sinespe" and impl == "-":
        impl = f"auto → {r['resolved_impl']}" if r.get("resolved_impl") else "auto"
    suffix = "" if impl in ("-", "fft") else f" ({impl})"
    decay = record_decay(r)
    return (f"{r['positional']}{suffix} + {r['attention']}" + ("" if decay == "none" else f" + decay {decay}")
            + (" (compiled)" if r.get("compiled") else ""))


def model_lines(merged: list[dict]) -> list[str]:
    """One table per (batch, length): median ms and peak MB of one AdamW step, ratios to APE."""
    if not merged:
        return []
    first = next((r for r in merged if r.get("rounds")), merged[0])
    opts = ", ".join(f"{k} {v}" for k, v in first["model"].items() if k not in ("positional", "attention", "decay"))
    lines = [f"### model: one AdamW step of the whole DecoderLM (vocabulary {first['vocab_size']}; {opts})", ""]
    for batch, length in dict.fromkeys((r["batch"], r["length"]) for r in merged):
        lines += [f"Batch {batch}, N = {length:,}:", "",
                  "| positional + attention | parameters | step ms | peak MB | time / APE | memory / APE | "
                  "tokens/s | steps (rounds) |", "|---|---|---|---|---|---|---|---|"]
        for r in (x for x in merged if (x["batch"], x["length"]) == (batch, length)):
            if not r.get("rounds"):
                lines.append(f"| {_name(r)} | | {r.get('skipped', 'failed')} | | | | | |")
                continue
            ratio = (f"{r['time_vs_ape']:.2f}× | {r['memory_vs_ape']:.2f}×" if "time_vs_ape" in r else "– | –")
            lines.append(f"| {_name(r)} | {r['parameters']:,} | {r['median_ms']:,.0f} | {r['peak_mb']:,.0f} | {ratio} | "
                         f"{r['tokens_per_s']:,.0f} | {len(r['times_ms'])} ({r['rounds']}) |")
        lines.append("")
    return lines


def cost_row(payload: dict, *, question: str, batch: int, length: int, source: str) -> str:
    """One row of a results summary (README's main results) from a ``spe bench --modes model`` run's
    JSON: ``| question | each encoding's time and memory × APE's | source |`` at ``batch`` × ``length``.

    Time is the median step over every round over APE's (the table's ``time / APE``), with the
    range of the per-round ratios (each round's median over APE's in the same round: rounds
    interleave the encodings, so a load that changes between rounds cancels within one); memory
    is the peak over APE's. The question cell names the machine's threads, rounds and load.

    Raises:
        ValueError: if the run holds no APE step or no other encoding at that shape.
    """
    shape = [r for r in payload.get("model") or [] if (r["batch"], r["length"]) == (batch, length) and r.get("rounds")]
    ape = [r for r in shape if r["positional"] == "ape"]
    others = [r for r in shape if r["positional"] != "ape" and "time_vs_ape" in r]
    if not ape or not others:
        raise ValueError(f"the bench run holds no APE step and other encodings at batch {batch} × N = {length:,} "
                         f"(shapes held: {sorted({(r['batch'], r['length']) for r in payload.get('model') or []})})")
    rounds = [r for r in payload.get("model_rounds") or [] if (r["batch"], r["length"]) == (batch, length)]
    ape_round = {r["round"]: r["median_ms"] for r in rounds if r["positional"] == "ape"}

    def key(r: dict) -> tuple:
        return r["positional"], r["impl"], r["attention"], record_decay(r)

    cells = []
    for r in others:
        ratios = sorted(x["median_ms"] / ape_round[x["round"]] for x in rounds
                        if key(x) == key(r) and x["round"] in ape_round)
        spread = f" (rounds {ratios[0]:.2f}–{ratios[-1]:.2f}×)" if len(ratios) > 1 else ""
        cells.append(f"`{_name(r)}` {r['time_vs_ape']:.2f}× time{spread}, {r['memory_vs_ape']:.2f}× memory")
    first = ape[0]
    loads = [x["load_1min"] for x in rounds if "load_1min" in x]
    load = f", load {min(loads):.1f}–{max(loads):.1f}" if loads else ""
    return (f"| {question}: one AdamW step at {batch} × {length:,} tokens, × APE's ({first['device']}, "
            f"{first['threads']} threads, {first['rounds']} rounds{load}) | {'; '.join(cells)} | {source} |")


def _fit_text(fit: dict) -> str:
    coef = fit["coefficients_mb"]
    text = f"{coef[0]:,.0f} MB + {coef[1] * 1024:,.1f} MB per 1,024 tokens"
    if len(coef) > 2:
        text += f" + {coef[2] * 2**20:,.3f} MB per (1,024 tokens)²"
    return f"{text} (least squares through N = {', '.join(f'{n:,}' for n in fit['points'])})"


def longest_lines(results: list[dict], budget_mb: float | None) -> list[str]:
    """The longest-length search: measured points, the answer, and whether it is extrapolated."""
    if not results:
        return []
    lines = [f"### longest trainable length, batch 1, within {budget_mb:,.0f} MB (whole process)", "",
             "| positional + attention | measured N: total MB (step s) | longest N | how |", "|---|---|---|---|"]
    for r in results:
        pts = ", ".join(f"{n:,}: {mb:,.0f} ({ms / 1000:.1f})" for n, mb, ms in r["points"])
        if r["longest"] is None:
            how = r["why"]
        elif r["extrapolated"]:
            how = f"extrapolated: {_fit_text(r['fit'])}; stopped: {r['why']}"
        else:
            how = "measured (bisection)"
        longest = "–" if r["longest"] is None else f"{r['longest']:,}"
        lines.append(f"| {_name({**r, 'resolved_impl': None})} | {pts} | {longest} | {how} |")
    return [*lines, ""]

"""FoX's and PaTH's two kernel forms in ``spe bench`` (``--fox-path-impl``): each FoX case (softmax
with a forget gate), PaTH and PaTH-FoX case measured once per form, labelled by the form that ran.

The forms, named as :data:`spe.ops.path.chunk.PATH_IMPLS` names PaTH's:

* ``chunk``: the form that forms the L × L terms and keeps them for backward. FoX: the one
  (B, H, L, L) bias (:func:`~spe.ops.softmax.chunk.gate_bias`, in blocks of
  :data:`~spe.ops.softmax.chunk.FOX_QUERY_BLOCK` queries beyond that length); PaTH: the chunked
  logits (``path_attention(impl="chunk")``).
* ``flash``: the O(L)-memory form (:func:`~spe.ops.softmax.flash.flash_fox_attention`,
  :func:`~spe.ops.path.flash.flash_path_attention`).
* ``auto``: each kernel's own choice by length (FoX flash from
  :data:`~spe.ops.softmax.chunk.FLASH_FOX_MIN_LENGTH` positions, PaTH from
  :data:`~spe.ops.path.flash.FLASH_MIN_LENGTH`).

The layer has no option for the form (the library chooses by length), so a worker process forces
one by moving the two length thresholds, which both kernels read at each call, to 0 (flash) or past
any length (chunk). Whether the forced form ran is not taken on trust: :func:`measure_in_form`
counts the calls of each form's entry point during the measurement and records the one that ran
(``fox_path_ran``), which is what the tables show.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter

__all__ = ["FOX_PATH_IMPLS", "auto_form", "form_label", "form_ratio_lines", "measure_in_form", "parse_fox_path_impls", "takes_form"]

FOX_PATH_IMPLS = ("auto", "chunk", "flash")
# The modes whose cases run FoX's or PaTH's parallel kernel (generate's step has one form).
FORM_MODES = ("train", "prefill")


def parse_fox_path_impls(text: str | None) -> list[str] | None:
    """``--fox-path-impl`` → forms, e.g. ``"chunk,flash"`` → ["chunk", "flash"]; None or "" gives None
    (no form asked: the kernels choose and rows carry no form).

    Raises:
        ValueError: naming the text when it names no form or one outside :data:`FOX_PATH_IMPLS`.
    """
    if not text:
        return None
    wanted = [w.strip() for w in text.split(",") if w.strip()]
    if not wanted or set(wanted) - set(FOX_PATH_IMPLS):
        raise ValueError(f"--fox-path-impl takes a comma-separated subset of {', '.join(FOX_PATH_IMPLS)}, "
                         f"got {text!r}")
    return list(dict.fromkeys(wanted))


def takes_form(mode: str, positional: str, attention: str, decay: str) -> bool:
    """Whether a bench case runs FoX's or PaTH's parallel kernel: softmax with a forget gate (FoX,
    PaTH-FoX) or PaTH, in a mode of :data:`FORM_MODES`."""
    from spe.lab.bench.targets import takes_decay

    gated = decay != "none" and takes_decay(attention, decay)
    return mode in FORM_MODES and attention == "softmax" and (gated or positional == "path")


def form_label(r: dict) -> str:
    """The form part of a row's label: ``" [flash]"``, ``" [chunk]"``, ``" [auto]"`` (what auto chose
    at each length: :func:`auto_form`), ``" [chunk, ran flash]"`` where a form other than the one
    asked for ran; "" for a record that asked for none."""
    asked, ran = r.get("fox_path_impl"), r.get("fox_path_ran")
    if asked is None:
        return ""
    return f" [{asked}]" if asked == "auto" or ran in (None, asked) else f" [{asked}, ran {ran}]"


def auto_form(r: dict) -> str | None:
    """The form ``auto`` ran for a measured record, or None for a record that forced one or asked none."""
    return r.get("fox_path_ran") if r.get("fox_path_impl") == "auto" else None


@contextlib.contextmanager
def _forced(form: str):
    """Both kernels' length thresholds set for ``form`` (``auto``: left alone) in this process."""
    import spe.ops.path.chunk as path_chunk
    import spe.ops.softmax.chunk as softmax_chunk

    saved = softmax_chunk.FLASH_FOX_MIN_LENGTH, path_chunk.FLASH_MIN_LENGTH
    if form != "auto":
        threshold = 0 if form == "flash" else sys.maxsize
        softmax_chunk.FLASH_FOX_MIN_LENGTH = path_chunk.FLASH_MIN_LENGTH = threshold
    try:
        yield
    finally:
        softmax_chunk.FLASH_FOX_MIN_LENGTH, path_chunk.FLASH_MIN_LENGTH = saved


@contextlib.contextmanager
def _counting(calls: Counter):
    """Counts, in ``calls``, each form's entry point as the kernels call it (their modules' names)."""
    import spe.ops.path.chunk as path_chunk
    import spe.ops.softmax.chunk as softmax_chunk

    spied = [(softmax_chunk, "flash_fox_attention", "flash"), (softmax_chunk, "gate_bias", "chunk"),
             (path_chunk, "flash_path_attention", "flash"), (path_chunk, "path_logits", "chunk")]
    saved = [(module, name, getattr(module, name)) for module, name, _ in spied]

    def counted(fn, form):
        def call(*args, **kwargs):
            calls[form] += 1
            return fn(*args, **kwargs)
        return call

    for (module, name, form), (_, _, fn) in zip(spied, saved):
        setattr(module, name, counted(fn, form))
    try:
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


def measure_in_form(measure, case: dict, device) -> dict:
    """``measure(case, device)``'s record; for a case with ``fox_path_impl`` (a form of
    :data:`FOX_PATH_IMPLS`), measured in that form, with ``fox_path_ran``: the form whose entry
    point ran (``flash``, ``chunk``, ``both`` or ``none``, e.g. FlexAttention on CUDA)."""
    form = case.get("fox_path_impl")
    if form is None:
        return measure(case, device)
    calls: Counter = Counter()
    with _forced(form), _counting(calls):
        result = measure(case, device)
    ran = [f for f in ("flash", "chunk") if calls[f]]
    return {**result, "fox_path_ran": "both" if len(ran) == 2 else (ran[0] if ran else "none")}


def _baseline(r: dict, records: list[dict]) -> dict | None:
    """Plain softmax at r's mode, length and softmax path: no gate, no form asked, its positional
    r's own where that is APE or none (a PaTH case: either), measured."""
    mine = r["positional"] if r["positional"] in ("ape", "none") else None
    for pos in ([mine] if mine else ["none", "ape"]):
        for b in records:
            if (b["mode"], b["positional"], b["attention"], b["length"]) == (r["mode"], pos, "softmax", r["length"]) \
                    and b.get("decay", "none") == "none" and b.get("fox_path_impl") is None \
                    and b.get("softmax_impl") == r.get("softmax_impl") and "median_ms" in b:
                return b
    return None


def _case(r: dict) -> tuple:
    """A record's case but for its form."""
    return (r["mode"], r["positional"], r["impl"], r["attention"], r["length"], r.get("decay", "none"),
            r.get("softmax_impl"))


def form_ratio_lines(rows: list[dict], label) -> list[str]:
    """A Markdown table of each measured form's time and memory over plain softmax's (same mode,
    length and softmax path: the targets' ratios) and over the chunk form's of its own case;
    ``label`` names a record's row (the tables' labels). [] where no record asked for a form."""
    formed = [r for r in rows if r.get("fox_path_impl") and "median_ms" in r]
    if not formed:
        return []
    lines = ["", "FoX and PaTH by kernel form (ratios to plain softmax at the same N; flash / chunk of the same "
             "case):", "", "| case | N | form ran | ms | MB | time / softmax | memory / softmax | flash / chunk time, "
             "memory |", "|---|---|---|---|---|---|---|---|"]
    for r in formed:
        base = _baseline(r, rows)
        chunk = next((c for c in formed if c.get("fox_path_ran") == "chunk" and _case(c) == _case(r)), None)
        vs_base = (f"{r['median_ms'] / base['median_ms']:.2f}× | {r['peak_mb'] / max(base['peak_mb'], 1e-9):.2f}×"
                   if base else "– | –")
        vs_chunk = (f"{r['median_ms'] / chunk['median_ms']:.2f}×, {r['peak_mb'] / max(chunk['peak_mb'], 1e-9):.2f}×"
                    if chunk and r.get("fox_path_ran") == "flash" else "–")
        lines.append(f"| {label(r)} | {r['length']:,} | {r.get('fox_path_ran', '?')} | {r['median_ms']:.1f} | "
                     f"{r['peak_mb']:.0f} | {vs_base} | {vs_chunk} |")
    return lines

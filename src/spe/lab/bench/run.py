"""``spe bench``: time and peak memory of attention layers with each positional encoding.

Every measurement runs in its own process (see :mod:`spe.lab.bench.worker`); variants are
compared as ratios within one run, because these machines are shared and noisy.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from spe.lab import strict_json
from spe.attention.fourier import MIXERS
from spe.attention.kernels import KERNELS
from spe.lab.bench.forms import auto_form, form_label, form_ratio_lines, takes_form
from spe.lab.bench.peers import PEER_ATTENTIONS
from spe.lab.bench.tables import longest_lines, model_lines
from spe.lab.bench.targets import find_record, record_decay, takes_decay, targets_markdown
from spe.encodings.registry import positional_names, positional_spec

__all__ = ["BENCH_ATTENTIONS", "GENERATE_MIN_REPEATS", "KERNEL_NAMES", "SERIES", "SPE_IMPLS", "bench_markdown", "bench_outputs", "layer_flops", "matmul_gflops", "parse_decays", "parse_pairs",
           "parse_softmax_impls",
           "parse_series", "run_bench", "run_case", "series_name", "summarize_bench", "write_outputs"]

log = logging.getLogger(__name__)

# How each stochastic encoding can be applied. The first entry is the default, measured when
# the name has no suffix: "-" is sineSPE's automatic choice (``SPEFilter(impl="auto")``, the
# record's ``resolved_impl`` says what it picked); "reference" is the straightforward twin.
SPE_IMPLS = {"sinespe": ("-", "fused", "blocked", "materialized", "reference"), "convspe": ("fft", "direct", "materialized", "blocked")}
# Suffixes accepted as aliases of the default: ``sinespe:auto``, ``convspe:fft``.
DEFAULT_ALIASES = {"sinespe": "auto", "convspe": "fft"}
# (positional, impl) pairs ``spe bench`` can measure, in table order.
SERIES = [("ape", "-"), *[(name, impl) for name in positional_names(stochastic=True, needs_grid=False) for impl in SPE_IMPLS[name]],
          *[(name, "-") for name in positional_names(stochastic=False) if name != "ape"]]
# Kernels by their registry names ("linear" meant linear-elu here before the normaliser-free kernel of that name).
BENCH_ATTENTIONS = ["softmax", "performer", "linear-elu"]
KERNEL_NAMES = (*KERNELS, *MIXERS)  # what --attentions may name: the kernels and the Fourier mixers
# Encodings that add a term to the scores exist for softmax attention only.
SCORE_ENCODINGS = positional_names(acts_on="scores")
# Encodings that transform a feature map's features exist for linear kernels only.
FEATURE_ENCODINGS = positional_names(acts_on="features")
MODES = ("train", "generate", "prefill", "model")
# A decoding step costs about a millisecond, and five of them give a median that moves by a
# third between lengths of one run; so generate cases time at least this many steps (still
# cut by the case's time budget).
GENERATE_MIN_REPEATS = 50


def series_name(positional: str, impl: str) -> str:
    """The command-line name of a series: ``sinespe`` (automatic choice), ``sinespe:blocked``…"""
    return positional if impl in ("-", SPE_IMPLS.get(positional, ("-",))[0]) else f"{positional}:{impl}"


def parse_series(text: str | None) -> list[tuple[str, str]]:
    """``--positionals`` → (positional, impl) pairs; None or "" gives every series.

    ``sinespe`` measures ``SPEFilter``'s automatic choice, ``sinespe:reference`` the
    straightforward twin, ``sinespe:fused|blocked|materialized`` one implementation;
    ``convspe`` (= ``convspe:fft``) the FFT path with the automatic application,
    ``convspe:direct`` its conv1d twin, ``convspe:materialized|blocked`` one application.

    Raises:
        ValueError: naming the unknown entries and the accepted names.
    """
    if not text:
        return list(SERIES)
    by_name = {series_name(p, i): (p, i) for p, i in SERIES}
    by_name.update({f"{p}:{alias}": (p, SPE_IMPLS[p][0]) for p, alias in DEFAULT_ALIASES.items()})
    wanted = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in by_name]
    if unknown or not wanted:
        raise ValueError(f"--positionals takes a comma-separated subset of {', '.join(by_name)}, got {text!r}")
    return list(dict.fromkeys(by_name[w] for w in wanted))


def parse_pairs(text: str) -> list[tuple[str, str, str]]:
    """``--pairs`` → (positional, impl, attention) triples, e.g. ``"ape+softmax,sinespe:blocked+performer"``.

    Raises:
        ValueError: naming the entry that is not ``SERIES+ATTENTION`` with a known series
            (:func:`parse_series`) and attention (:data:`KERNEL_NAMES` or a peer's).
    """
    out = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, _, attention = entry.partition("+")
        if attention not in (*KERNEL_NAMES, *PEER_ATTENTIONS):
            raise ValueError(f"--pairs entry {entry!r} must be SERIES+ATTENTION with ATTENTION one of "
                             f"{', '.join([*KERNEL_NAMES, *PEER_ATTENTIONS])}")
        (pos, impl), = parse_series(name)
        out.append((pos, impl, attention))
    if not out:
        raise ValueError(f"--pairs names no case: {text!r}")
    return list(dict.fromkeys(out))


def parse_decays(text: str | None, default: str = "none") -> list[str]:
    """``--decay`` → decay modes, e.g. ``"none,fixed"`` → ["none", "fixed"]; None gives ``[default]``
    (the ``--config``'s decay).

    Raises:
        ValueError: naming the text when it names no mode or one outside
            :data:`spe.ops.decay.DECAY_MODES`.
    """
    from spe.ops.decay import DECAY_MODES

    if text is None:
        return [default]
    wanted = [w.strip() for w in text.split(",") if w.strip()]
    if not wanted or set(wanted) - set(DECAY_MODES):
        raise ValueError(f"--decay takes a comma-separated subset of {', '.join(DECAY_MODES)}, got {text!r}")
    return list(dict.fromkeys(wanted))


def parse_blocks(text: str | None) -> list[int]:
    """``--attention-blocks`` → block lengths N of block-local attention, e.g. ``"0,64"`` → [0, 64]
    (0: full attention); None or "" gives [0].

    Raises:
        ValueError: naming the flag and the text unless it is comma-separated integers ≥ 0.
    """
    if not text:
        return [0]
    try:
        wanted = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        wanted = []
    if not wanted or min(wanted) < 0:
        raise ValueError(f"--attention-blocks takes comma-separated block lengths (0: full attention), "
                         f"got {text!r}")
    return list(dict.fromkeys(wanted))


def _takes_blocks(pos: str, att: str, dec: str) -> bool:
    """Whether a case may run block-local (:func:`spe.attention.layer.check_attention_blocks`): softmax
    without a gate, with every encoding but one whose scores are more than a distance's (PaTH)."""
    return att == "softmax" and dec == "none" and not positional_spec(pos).takes_gate


def parse_softmax_impls(text: str | None) -> list[str]:
    """``--softmax-impl`` → softmax's paths, e.g. ``"blocks,flex"`` → ["blocks", "flex"]; None or ""
    gives ["auto"].

    Raises:
        ValueError: naming the text when it names no path or one outside
            :data:`spe.ops.softmax.flex.SOFTMAX_IMPLS`.
    """
    from spe.ops.softmax.flex import SOFTMAX_IMPLS

    if not text:
        return ["auto"]
    wanted = [w.strip() for w in text.split(",") if w.strip()]
    if not wanted or set(wanted) - set(SOFTMAX_IMPLS):
        raise ValueError(f"--softmax-impl takes a comma-separated subset of {', '.join(SOFTMAX_IMPLS)}, "
                         f"got {text!r}")
    return list(dict.fromkeys(wanted))


def matmul_gflops(size: int = 2048, repeats: int = 5) -> float:
    """This machine's float32 matmul rate (GFLOP/s, median of ``repeats``)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * size**3 / sorted(times)[len(times) // 2] / 1e9


def _takes_mixer(pos: str, att: str, mode: str) -> bool:
    """Whether a Fourier mixer's case exists: an encoding on tokens (or none), and FNet (not causal)
    in train mode only (it neither decodes nor builds a DecoderLM)."""
    return positional_spec(pos).acts_on in (None, "tokens") and (MIXERS[att].causal or mode == "train")


def _fft_flops(points: int) -> float:
    return 5 * points * math.log2(max(points, 2))  # a complex FFT of that many points


def layer_flops(case: dict) -> float:
    """Forward FLOPs of one causal attention layer (projections, SPE, features, kernel); of a
    Fourier mixer, its FFTs (FNet: over channels and length; the causal twin: over channels, then
    three of P ≥ 2L − 1 points and the state's N = L points per channel)."""
    b, n, h, d = case["batch"], case["length"], case["num_heads"], case["head_dim"]
    if case["attention"] in MIXERS:
        c = h * d
        channels = b * n * _fft_flops(c)
        if not MIXERS[case["attention"]].causal:
            return channels + b * c * _fft_flops(n)
        return channels + b * c * (3 * _fft_flops(1 << max(2 * n - 2, 1).bit_length()) + _fft_flops(n))
    r, k, m, c = case["num_realizations"], case["num_sines"], case["num_features"], case["chunk_size"]
    flops = 2 * b * n * (h * d) * (4 * h * d)  # q, k, v and output projections
    e = d
    if case["positional"] == "sinespe":
        flops += 2 * 2 * b * n * h * d * (2 * k + 1) * r
        e = r
    elif case["positional"] == "convspe":
        flops += 2 * 2 * b * n * h * d * r
        e = r
    if case["attention"] == "softmax" and case.get("attention_blocks"):  # N/2 + N keys a query on average
        return flops + 2 * b * h * n * min(n, 1.5 * case["attention_blocks"]) * (e + d)
    if case["attention"] == "softmax":
        return flops + 2 * b * h * n * n * (e + d) / 2
    if case["attention"] in ("performer", *PEER_ATTENTIONS):
        flops += 2 * 2 * b * n * h * e * m
        e = m
    return flops + 2 * b * n * h * (2 * e * (d + 1) + c * e + c * (d + 1))


def run_case(case: dict, timeout: float) -> dict:
    """Runs one case in a fresh worker process; a timeout or failure gives a record with ``skipped``.

    The record carries ``load_1min``, the machine's 1-minute load average when the case
    started, so that a report can say how busy the cores were during each measurement.
    """
    case = {**case, "load_1min": os.getloadavg()[0]}
    cmd = [sys.executable, "-m", "spe.lab.bench.worker", json.dumps(case)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**case, "skipped": f"timed out after {timeout:.0f} s"}
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {**case, "skipped": f"failed: {tail}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_bench(*, lengths: list[int], modes: list[str], series: list[tuple[str, str]] | None = None,
              attentions: list[str] | None = None, batch: int = 2, num_heads: int = 8, head_dim: int = 64,
              num_realizations: int = 64, num_sines: int = 5, kernel_size: int = 128, num_features: int = 64,
              chunk_size: int = 64, repeats: int = 5, budget_s: float = 30.0, memory_limit_mb: float = 12000,
              device: str = "cpu", threads: int = 0, progress: bool = True, model: dict | None = None,
              vocab_size: int = 300, model_batch: int = 8,
              pairs: list[tuple[str, str, str]] | None = None, decay: str | list[str] = "none",
              precision: str = "fp32", softmax_impls: list[str] | None = None,
              fox_path_impls: list[str] | None = None, attention_blocks: list[int] | None = None) -> dict:
    """Measures every series × attention × length × mode; returns {"records", "matmul_gflops", ...}.

    Modes: ``train`` (forward+backward of one attention layer), ``generate`` (one recurrent
    step at position N, at least :data:`GENERATE_MIN_REPEATS` timed steps), ``prefill`` (one layer
    reading N positions at once with its decoding state; the table adds N × the generate step
    beside it), ``model`` (one AdamW step of a whole DecoderLM built from ``model``
    options, batch ``model_batch``; records its parameter count). Pairs that cannot exist
    (a score encoding with a linear kernel) are left out; another package's layer
    (``attentions`` may name those of :data:`spe.lab.bench.peers.PEER_ATTENTIONS`) is measured in
    train mode with ``ape`` or ``none`` only, and recorded as skipped when not installed. A case is skipped (and recorded as
    such) when the previous length's time or memory, extrapolated with the kernel's
    complexity, exceeds ``budget_s`` or ``memory_limit_mb``. ``pairs`` ((positional, impl,
    attention) triples, :func:`parse_pairs`) replaces the product of ``series`` and
    ``attentions`` when given, so that one run measures exactly the cases a report needs.
    ``decay`` (``none``, ``fixed``, ``learned``: :class:`~spe.models.ModelConfig`'s, or a list
    of them) multiplies the linear kernels' cases: each is measured once per decay mode, in the
    same run, so that decay costs read as ratios; softmax and other packages' cases run once,
    without (they take none). Every record carries its ``decay``. ``precision`` (``fp32``,
    ``bf16``, ``fp16``) is the autocast of the timed work (:mod:`spe.lab.engine.precision`).
    ``softmax_impls`` (:data:`~spe.ops.softmax.flex.SOFTMAX_IMPLS`; default ``["auto"]``) multiplies
    the softmax cases as ``decay`` does the linear ones: each is measured once per path
    (FlexAttention or the per-block form, :mod:`spe.ops.softmax.flex`), the record carrying its
    ``softmax_impl`` (and ``softmax_fallback`` where a forced flex fell back). ``fox_path_impls``
    (:data:`~spe.lab.bench.forms.FOX_PATH_IMPLS`; default None: the kernels choose) multiplies the
    train and prefill cases of FoX (softmax with a gate), PaTH and PaTH-FoX likewise, once per
    kernel form (:mod:`spe.lab.bench.forms`), each record carrying ``fox_path_impl`` (asked) and
    ``fox_path_ran`` (the form that ran). ``attention_blocks`` (block lengths N, 0: full attention;
    default [0]) multiplies the softmax cases that take block-local attention
    (:mod:`spe.ops.softmax.local`; not FoX, not PaTH) likewise, each record carrying its
    ``attention_blocks`` when N > 0.
    """
    decays = list(dict.fromkeys([decay] if isinstance(decay, str) else decay))
    series = series or SERIES
    attentions = attentions or BENCH_ATTENTIONS
    common = dict(batch=batch, num_heads=num_heads, head_dim=head_dim, num_realizations=num_realizations,
                  num_sines=num_sines, kernel_size=kernel_size, num_features=num_features,
                  chunk_size=chunk_size, repeats=repeats, device=device, threads=threads,
                  max_seconds=budget_s, decay=",".join(decays), precision=precision)
    triples = pairs or [(pos, impl, att) for pos, impl in series for att in attentions]
    plan = [(mode, pos, impl, att, dec) for mode in modes for pos, impl, att in triples for dec in decays
            if (dec == "none" or takes_decay(att, dec)) and not (mode != "train" and impl == "reference")
            and not (pos in SCORE_ENCODINGS and att != "softmax")
            and not (pos in FEATURE_ENCODINGS and att == "softmax")
            and not (att in PEER_ATTENTIONS and (mode != "train" or pos not in ("ape", "none")))
            and not (att in MIXERS and not _takes_mixer(pos, att, mode))
            and not (dec != "none" and pos in SCORE_ENCODINGS and not positional_spec(pos).takes_gate)]
    impls = list(dict.fromkeys(softmax_impls or ["auto"]))
    plan = [(*p, si) for p in plan for si in (impls if p[3] == "softmax" else ["auto"])]
    plan = [(*p, form) for p in plan
            for form in (fox_path_impls if fox_path_impls and takes_form(p[0], p[1], p[3], p[4]) else [None])]
    blocks = list(dict.fromkeys(attention_blocks or [0]))
    plan = [(*p, nb) for p in plan for nb in blocks if nb == 0 or (p[6] is None and _takes_blocks(p[1], p[3], p[4]))]
    total = len(plan) * len(lengths)
    records = []
    done = 0
    for mode, pos, impl, att, dec, si, form, nb in plan:
        prev = None
        for n in sorted(lengths):
            done += 1
            case = {**common, "mode": mode, "positional": pos, "impl": impl, "attention": att, "length": n,
                    "decay": dec, **({} if si == "auto" else {"softmax_impl": si}),
                    **({} if form is None else {"fox_path_impl": form}), **({"attention_blocks": nb} if nb else {})}
            if mode == "generate":
                case["repeats"] = max(repeats, GENERATE_MIN_REPEATS)
            if mode == "model":
                case.update(batch=model_batch, model=model or {}, vocab_size=vocab_size)
            why = _predicted_too_big(prev, n, "local" if nb else att, mode, budget_s, memory_limit_mb)
            result = {**case, "skipped": why} if why else run_case(case, timeout=max(120.0, 8 * budget_s))
            if "median_ms" in result:
                # forward + backward ≈ 3 × forward FLOPs; generation steps are not rated
                result["gflops_per_s"] = (3 * layer_flops(case) / (result["median_ms"] / 1000) / 1e9
                                          if mode == "train" else None)
                if mode == "model":
                    result["tokens_per_s"] = case["batch"] * n / (result["median_ms"] / 1000)
                prev = result
            records.append(result)
            if progress:
                state = result.get("skipped") or f"{result['median_ms']:.1f} ms, {result['peak_mb']:.0f} MB"
                with_decay = (("" if dec == "none" else f" decay {dec}") + ("" if si == "auto" else f" [{si}]")
                              + form_label(result) + (f" blocks {nb}" if nb else ""))
                print(f"[{done}/{total}] {mode:8s} {pos:8s} {impl:9s} {att:9s}{with_decay} N={n:<6d} {state}",
                      file=sys.stderr, flush=True)
    return {"records": records, "matmul_gflops": matmul_gflops(), "config": common, "lengths": lengths}


def _predicted_too_big(prev: dict | None, n: int, attention: str, mode: str, budget_s: float,
                       memory_mb: float) -> str | None:
    if prev is None:
        return None
    ratio = n / prev["length"]
    time_exp = 2 if (attention == "softmax" and mode != "generate") else 1
    if mode == "generate":
        time_exp = 1 if attention == "softmax" or attention in MIXERS else 0  # a Fourier state: N = the length
    t = prev["median_ms"] / 1000 * ratio**time_exp * (prev.get("repeats", 1) + 1)
    # FoX's and PaTH's chunk form keeps L × L terms (spe.lab.bench.forms); every other layer O(L)
    mem = max(prev["peak_mb"], 1.0) * ratio ** (2 if prev.get("fox_path_ran") == "chunk" else 1)
    if t > budget_s * 4:
        return f"skipped: predicted {t:.0f} s"
    if mem > memory_mb:
        return f"skipped: predicted {mem:.0f} MB"
    return None


def _label(r: dict) -> str:
    if r["impl"] == "-" and r["positional"] in SPE_IMPLS:
        impl = " (auto)"  # what it picked per length: the record's resolved_impl
    else:
        impl = "" if r["impl"] in ("-", "fft") else f" ({r['impl']})"
    decay = record_decay(r)
    path = r.get("softmax_impl", "auto")  # softmax's path when asked for (spe bench --softmax-impl)
    path = "" if path == "auto" else f" [{path}{', fell back' if r.get('softmax_fallback') else ''}]"
    with_decay = "" if decay == "none" else f" + decay {decay}"
    blocks = f" blocks {r['attention_blocks']}" if r.get("attention_blocks") else ""
    return f"{r['positional']}{impl} + {r['attention']}{blocks}{path}{form_label(r)}{with_decay}"


def summarize_bench(result: dict) -> dict:
    """Scaling exponents, ratios to APE-Performer and the target figures."""
    recs = [r for r in result["records"] if "median_ms" in r]

    def get(mode, pos, impl, att, n):
        return find_record(recs, mode, pos, impl, att, n)

    def series_key(r):
        path = r.get("softmax_impl", "auto")
        form = r.get("fox_path_impl")
        attention = (r["attention"] + ("" if path == "auto" else f":{path}") + ("" if form is None else f"[{form}]")
                     + (f"-blocks-{r['attention_blocks']}" if r.get("attention_blocks") else ""))
        return r["mode"], r["positional"], r["impl"], attention, record_decay(r)

    out: dict = {"exponents": {}, "ratios_to_ape_performer": {}, "targets": {}}
    for key in sorted({series_key(r) for r in recs}):
        pts = sorted((r["length"], r["median_ms"]) for r in recs if series_key(r) == key)
        if len(pts) >= 2 and pts[-1][0] > pts[0][0]:  # two lengths (one length may hold several records)
            (n0, t0), (n1, t1) = pts[0], pts[-1]
            name = " ".join(key[:4]) + ("" if key[4] == "none" else f" decay-{key[4]}")
            out["exponents"][name] = {"from": n0, "to": n1, "exponent": math.log(t1 / t0) / math.log(n1 / n0)}
    for r in recs:
        base = get(r["mode"], "ape", "-", "performer", r["length"])
        if base and r is not base:
            out["ratios_to_ape_performer"][f"{r['mode']} {_label(r)} N={r['length']}"] = {
                "time": r["median_ms"] / base["median_ms"], "memory": r["peak_mb"] / max(base["peak_mb"], 1e-9)}
    t = out["targets"]

    def sine(mode, att, n):  # the default (automatic) sineSPE, or the fused form in older runs
        return get(mode, "sinespe", "-", att, n) or get(mode, "sinespe", "fused", att, n)

    ref = get("train", "sinespe", "reference", "performer", 4096)
    for impl in ("-", "fused", "blocked"):
        fast = get("train", "sinespe", impl, "performer", 4096)
        if fast and ref:
            t[f"reference_vs_{'auto' if impl == '-' else impl}_sinespe_N4096"] = {
                "time_ratio": ref["median_ms"] / fast["median_ms"],
                "memory_ratio": ref["peak_mb"] / max(fast["peak_mb"], 1e-9)}
    if ref and get("train", "sinespe", "fused", "performer", 4096):  # the name earlier runs used
        t["fused_vs_reference_sinespe_N4096"] = t["reference_vs_fused_sinespe_N4096"]
    ape_p = get("train", "ape", "-", "performer", 4096)
    for key, rec in [("spe_performer_vs_ape_performer_N4096", sine("train", "performer", 4096)),
                     ("convspe_performer_vs_ape_performer_N4096", get("train", "convspe", "fft", "performer", 4096)),
                     ("convspe_direct_performer_vs_ape_performer_N4096",
                      get("train", "convspe", "direct", "performer", 4096))]:
        if rec and ape_p:
            t[key] = {"time_ratio": rec["median_ms"] / ape_p["median_ms"],
                      "memory_ratio": rec["peak_mb"] / max(ape_p["peak_mb"], 1e-9)}
    lin = get("train", "ape", "-", "linear-elu", 8192) or get("train", "ape", "-", "linear", 8192)
    soft = get("train", "ape", "-", "softmax", 8192)
    if lin and soft:
        t["linear_chunked_vs_sdpa_causal_N8192_speedup"] = soft["median_ms"] / lin["median_ms"]
    a, b = sine("train", "performer", 1024), sine("train", "performer", 16384)
    if a and b:
        t["spe_performer_exponent_1024_16384"] = math.log(b["median_ms"] / a["median_ms"]) / math.log(16)
    g0, g1 = sine("generate", "performer", 512), sine("generate", "performer", 8192)
    if g0 and g1:
        t["generation_per_token_8192_vs_512"] = g1["median_ms"] / g0["median_ms"]
        t["generation_memory_mb_512_8192"] = [g0["peak_mb"], g1["peak_mb"]]
    p = sine("train", "performer", 8192)
    if p:
        t["spe_performer_N8192_gflops"] = p["gflops_per_s"]
        t["fraction_of_matmul_rate"] = p["gflops_per_s"] / result["matmul_gflops"]
    return out



def bench_outputs(out_dir: str | os.PathLike, json_path: str | os.PathLike | None) -> tuple[Path, Path]:
    """The output folder and JSON file of a run (default ``OUT/bench.json``), checked before anything is measured.

    Raises:
        ValueError: as :func:`spe.lab.outputs.check_output_folder` and :func:`spe.lab.outputs.check_output_file`.
    """
    from spe.lab.outputs import check_output_file, check_output_folder

    out = check_output_folder(out_dir)
    return out, check_output_file(json_path if json_path else out / "bench.json", "--json")


def write_outputs(result: dict, json_path: Path, out_dir: Path) -> None:
    """Writes the JSON records, a Markdown table and log-log plots."""
    from spe.checkpoint import atomic_write

    summary = summarize_bench(result)
    payload = {"records": result["records"], "matmul_gflops": result["matmul_gflops"], "config": result["config"],
               "lengths": sorted(result["lengths"]), "summary": summary, "code_errors": result.get("code_errors")}
    for key in ("model", "model_rounds", "longest", "load", "memory_budget_mb", "command", "precision"):
        if result.get(key) is not None:
            payload[key] = result[key]
    atomic_write(json_path, lambda tmp: Path(tmp).write_text(strict_json.dumps(payload, indent=2)))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.md").write_text(bench_markdown(payload))
    _plot(result, out_dir)


def bench_markdown(payload: dict) -> str:
    """The Markdown report of one run, from its JSON payload (what ``write_outputs`` writes):
    the targets, the whole-model and longest-length tables, the one-layer tables."""
    lengths = payload.get("lengths") or sorted({r["length"] for r in payload["records"]})
    precision = payload.get("precision", "fp32")
    lines = ([f"Precision: {precision} autocast of every timed step (weights float32).", ""]
             if precision != "fp32" else []) + targets_markdown(payload)
    lines += model_lines(payload.get("model") or []) + longest_lines(payload.get("longest") or [],
                                                                     payload.get("memory_budget_mb"))
    model_rows = [r for r in payload["records"] if r["mode"] == "model"]
    if model_rows:
        lines += _model_table(model_rows, lengths, payload["config"])
    for mode, what in (("train", "forward+backward of one causal layer"), ("generate", "one recurrent step at "
                       "position N"), ("prefill", "a prompt of N positions in one pass, output and decoding state")):
        rows = [r for r in payload["records"] if r["mode"] == mode]
        if not rows:
            continue
        lines += [f"### {mode}: {what} (median ms / peak MB)", "",
                  "| positional + attention | " + " | ".join(f"N={n}" for n in lengths) + " |",
                  "|---|" + "---|" * len(lengths)]
        for key in dict.fromkeys(_label(r) for r in rows):
            cells = []
            for n in lengths:
                r = next((x for x in rows if _label(x) == key and x["length"] == n), None)
                cells.append("" if r is None else ("–" if "median_ms" not in r else f"{r['median_ms']:.1f} / {r['peak_mb']:.0f}"))
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
        lines += _auto_choices(rows) + (_prefill_ratios(rows, payload["records"]) if mode == "prefill" else [])
        lines += form_ratio_lines(rows, _label)
        lines.append("")
    if payload.get("code_errors"):
        lines += ["### sineSPE estimation error vs R (RMS; Gaussian vs orthogonal noise)", "",
                  "| R | kernel, gaussian | kernel, orthogonal | logit, gaussian | logit, orthogonal |",
                  "|---|---|---|---|---|"]
        errs = payload["code_errors"]
        for r in dict.fromkeys(e["num_realizations"] for e in errs):
            g = next(e for e in errs if e["num_realizations"] == r and e["noise"] == "gaussian")
            o = next(e for e in errs if e["num_realizations"] == r and e["noise"] == "orthogonal")
            lines.append(f"| {r} | {g['kernel_rms']:.4f} | {o['kernel_rms']:.4f} | {g['logit_rms']:.4f} | {o['logit_rms']:.4f} |")
        lines.append("")
    lines += [f"float32 matmul rate: {payload['matmul_gflops']:.0f} GFLOP/s", ""]
    return "\n".join(lines)


def _prefill_ratios(rows: list[dict], records: list[dict]) -> list[str]:
    """How much faster a prompt is read in one pass than token by token: N × the generate
    step at position N (an upper estimate of the steps' cost, which grows to it for softmax)
    over the prefill time, for the lengths both modes measured."""
    lines = []
    for r in rows:
        step = next((g for g in records if g["mode"] == "generate" and _label(g) == _label(r)
                     and g["length"] == r["length"] and "median_ms" in g), None)
        if step is not None and "median_ms" in r:
            lines.append(f"- {_label(r)}, N={r['length']}: token by token ≈ {r['length']} × "
                         f"{step['median_ms']:.2f} ms = {r['length'] * step['median_ms']:.0f} ms, prefill "
                         f"{r['median_ms']:.0f} ms ({r['length'] * step['median_ms'] / r['median_ms']:.0f}×)")
    return ["", *lines] if lines else []


def _auto_choices(rows: list[dict]) -> list[str]:
    picked = list(dict.fromkeys(f"{r['positional']} + {r['attention']} N={r['length']}: {r['resolved_impl']}"
                                for r in rows if r.get("resolved_impl")))  # one per length, blocks or not
    picked += [f"{_label(r)} N={r['length']}: {auto_form(r)} form" for r in rows if auto_form(r)]
    return ["", "auto chose: " + "; ".join(picked)] if picked else []


def _model_table(rows: list[dict], lengths: list[int], config: dict) -> list[str]:
    first = rows[0]
    opts = ", ".join(f"{k} {v}" for k, v in first["model"].items() if k not in ("positional", "attention", "decay"))
    lines = [f"### model: one AdamW step of the whole DecoderLM (batch {first['batch']}, vocabulary "
             f"{first['vocab_size']}; {opts})", "",
             "| positional + attention | parameters | " + " | ".join(f"N={n}: ms / MB / tokens/s" for n in lengths)
             + " |", "|---|---|" + "---|" * len(lengths)]
    for key in dict.fromkeys(_label(r) for r in rows):
        mine = [r for r in rows if _label(r) == key]
        params = next((r["parameters"] for r in mine if "parameters" in r), None)
        cells = []
        for n in lengths:
            r = next((x for x in mine if x["length"] == n), None)
            cells.append("" if r is None else ("–" if "median_ms" not in r else
                                               f"{r['median_ms']:.0f} / {r['peak_mb']:.0f} / {r['tokens_per_s']:,.0f}"))
        lines.append(f"| {key} | {'' if params is None else f'{params:,}'} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _plot(result: dict, out_dir: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    for mode, field, ylabel, name in [("train", "median_ms", "forward+backward time (ms)", "bench_time.png"),
                                      ("train", "peak_mb", "peak memory growth (MB)", "bench_memory.png"),
                                      ("generate", "median_ms", "time per generated token (ms)", "bench_generate.png")]:
        rows = [r for r in result["records"] if r["mode"] == mode and "median_ms" in r]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(7.5, 5))
        for key in dict.fromkeys(_label(r) for r in rows):
            pts = sorted((r["length"], max(r[field], 1e-3)) for r in rows if _label(r) == key)
            ax.plot(*zip(*pts), "o-", label=key, lw=1.2, ms=3)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N (tokens)" if mode == "train" else "position of the generated token")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel}, batch {result['config']['batch']}, {result['config']['num_heads']} heads × "
                     f"{result['config']['head_dim']}, R={result['config']['num_realizations']}")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)

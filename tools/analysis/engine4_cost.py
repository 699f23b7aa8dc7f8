"""Before/after costs of FoX, PaTH, PaTH-FoX and convSPE at length (docs/bench/cpu.md's
"FoX, PaTH and convSPE at length" table), for one source tree per run.

Run from the repository root, on an otherwise idle machine (about 8 minutes on 2 cores; each case
at most its budget)::

    git worktree add /tmp/before <the commit before the change>
    python tools/analysis/engine4_cost.py --src /tmp/before/src --out runs/engine4/before.json
    python tools/analysis/engine4_cost.py --out runs/engine4/after.json
    python tools/analysis/engine4_cost.py --render runs/engine4/before.json runs/engine4/after.json

Cases, each in its own process (``PYTHONPATH`` = ``--src``, ``--threads`` threads), each the
median of ``--repeats`` timed runs after a warm-up, peak memory the growth of the process's
maximum resident set size over the warm-up and the timed runs (MiB):

* ``op``: one causal layer's kernel, forward + backward of (y²).sum(), B 1, H 4, D 64, float32,
  at L = 2,048 and 8,192: softmax (PyTorch's ``scaled_dot_product_attention``), FoX
  (``softmax_attention`` with a forget gate, as it chooses), PaTH and PaTH-FoX
  (``path_attention``, as it chooses); ``*-old`` forces the form that stores the L × L terms
  (FoX: ``FLASH_FOX_MIN_LENGTH`` past L; PaTH: ``impl="chunk"``), "n/a" where the tree has no
  other form.
* ``model``: one AdamW step of the main job's model (``spe.lab.bench.worker.model_step``): APE
  and convSPE at 2 × 8,192; PaTH-FoX (``--positional path --decay gated``) at 1 × 16,384.
* ``layer``: ``spe bench``'s train case (B 2, H 8, D 64, R 64, P 128, Performer) at 4,096:
  APE and convSPE.

A case over ``--budget-s`` seconds (the PaTH-FoX model step: 3×) or ``--memory-limit-mb`` MiB
of resident memory is stopped and recorded as such; a longer length of a kernel over either at a shorter one is not run.
``--smoke`` runs every case at tiny sizes (for tests).

``--profile NAME:L`` (e.g. ``path-fox:2048``, ``"model convspe:8192"``) runs one case in this
process under ``torch.profiler`` instead: one warm-up, one profiled run, and prints each operator's
share of the run's self CPU time (shares, not times, so that a shared machine still reads them),
the ``--rows`` largest::

    python tools/analysis/engine4_cost.py --profile path-fox:2048 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "docs"))

from doc_block import replace_block  # noqa: E402

BEGIN, END = "<!-- engine4-cost:begin -->", "<!-- engine4-cost:end -->"
OPS = ("softmax", "fox", "fox-old", "path", "path-old", "path-fox", "path-fox-old")
MAIN_JOB = {"d_model": 256, "num_layers": 4, "num_heads": 4, "d_ff": 1024, "dropout": 0.1, "gated": False,
            "num_realizations": 32, "num_sines": 5}
LAYER = {"batch": 2, "num_heads": 8, "head_dim": 64, "num_realizations": 64, "num_sines": 5, "kernel_size": 128,
         "num_features": 64, "chunk_size": 64, "impl": "-", "attention": "performer", "decay": "none"}
# (target ratio of time, of memory, the row it is a ratio to): the targets of FoX, PaTH and convSPE at length
TARGETS = {"fox": (2, 2, "softmax"), "path": (4, 3, "softmax"), "path-fox": (4, 3, "softmax"),
           "model convspe": (1.5, None, "model ape"), "layer convspe": (5, None, "layer ape")}
PATH_FOX_MEMORY_TARGET_MB = 4096


def plan(smoke: bool = False) -> list[dict]:
    """Every case of one run, in order (shorter lengths first, so that a longer one can be skipped)."""
    op_lengths = (64, 128) if smoke else (2048, 8192)
    cases = [{"kind": "op", "name": op, "length": n, "batch": 1} for n in op_lengths for op in OPS]
    model = {**MAIN_JOB, "d_model": 32, "d_ff": 64, "num_layers": 2, "num_realizations": 4} if smoke else MAIN_JOB
    big = (2, 256) if smoke else (2, 8192)
    cases += [{"kind": "model", "name": f"model {pos}", "positional": pos, "attention": "performer",
               "batch": big[0], "length": big[1], "model": model} for pos in ("ape", "convspe")]
    layer = {**LAYER, "num_heads": 2, "head_dim": 8, "num_realizations": 4, "kernel_size": 8} if smoke else LAYER
    cases += [{"kind": "layer", "name": f"layer {pos}", "positional": pos, "length": 128 if smoke else 4096, **layer}
              for pos in ("ape", "convspe")]
    cases.append({"kind": "model", "name": "model path-fox", "positional": "path", "attention": "softmax",
                  "decay": "gated", "batch": 1, "length": 256 if smoke else 16384, "model": model, "memory_only": True,
                  "budget_factor": 3})  # one step of 4 layers at 16,384: more than a kernel's budget
    return cases


# --- one case, in its own process -------------------------------------------------------------

def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _op_run(case: dict):
    """(forward + backward, or None where the tree has no such form) of an ``op`` case."""
    import inspect

    import torch
    import torch.nn.functional as F

    name, n, h, d = case["name"], case["length"], 4, 64
    g = torch.Generator().manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, generator=g).requires_grad_()

    if name == "softmax":
        q, k, v = (leaf(1, h, n, d) for _ in range(3))
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum().backward()
    from spe.ops import path_attention, softmax_attention

    q, k, v = (leaf(1, n, h, d) for _ in range(3))
    gate = (0.1 * torch.rand(1, n, h, generator=g).log()).requires_grad_() if "fox" in name else None
    if name.startswith("fox"):
        if name == "fox-old":
            import spe.ops.softmax.chunk as chunk

            if not hasattr(chunk, "FLASH_FOX_MIN_LENGTH"):
                return None
            chunk.FLASH_FOX_MIN_LENGTH = n + 1  # the gate term as a tensor at this length
        return lambda: softmax_attention(q, k, v, causal=True, log_decay=gate).square().sum().backward()
    w = F.normalize(torch.randn(1, n, h, d, generator=g), dim=-1).requires_grad_()
    beta = (2 * torch.rand(1, n, h, generator=g)).requires_grad_()
    extra = {}
    if name.endswith("-old"):
        if "impl" not in inspect.signature(path_attention).parameters:
            return None
        extra["impl"] = "chunk"
    return lambda: path_attention(q, k, v, w, beta, log_decay=gate, **extra).square().sum().backward()


def _bench_run(case: dict):
    import torch

    from spe.lab.bench import worker

    if case["kind"] == "model":
        bench_case = {"model": {**case["model"], **({"decay": case["decay"]} if "decay" in case else {})},
                      "vocab_size": 486, "positional": case["positional"], "attention": case["attention"],
                      "impl": "-", "batch": case["batch"], "length": case["length"]}
        run, _ = worker.model_step(bench_case, torch.device("cpu"))
        return run
    layer, encoding, ape = worker.build({**case, "attention": case["attention"]}, "cpu")
    n, b = case["length"], case["batch"]
    x = torch.randn(b, n, case["num_heads"] * case["head_dim"], requires_grad=True)
    g = torch.Generator().manual_seed(0)
    params = list(layer.parameters()) + (list(encoding.parameters()) if encoding is not None else [])

    def run() -> None:  # as spe bench's train mode (spe.lab.bench.worker.measure_train)
        inp = ape(x, torch.arange(n)) if ape is not None else x
        code = encoding(n, generator=g) if encoding is not None else None
        layer(inp, code).float().square().mean().backward()
        for p in params + [x]:
            p.grad = None

    return run


def profile_case(case: dict, rows: int = 15) -> list[tuple[str, float, int]]:
    """(operator, share of the profiled run's self CPU time, calls) of one case's ``rows`` largest
    operators, after a warm-up run; [] where the tree has no such form."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    run = _op_run(case) if case["kind"] == "op" else _bench_run(case)
    if run is None:
        return []
    run()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ops) or 1.0
    return [(e.key, e.self_cpu_time_total / total, e.count) for e in ops[:rows]]


def _find_case(spec: str, smoke: bool) -> dict:
    """The case of :func:`plan` that ``NAME:L`` names.

    Raises:
        ValueError: naming ``spec`` and the cases there are.
    """
    name, _, length = spec.rpartition(":")
    cases = plan(smoke)
    found = next((c for c in cases if c["name"] == name and str(c["length"]) == length), None)
    if found is None:
        known = ", ".join(dict.fromkeys(f"{c['name']}:{c['length']}" for c in cases))
        raise ValueError(f"--profile {spec!r}: no such case (NAME:L, one of {known})")
    return found


def measure_case(case: dict, repeats: int, budget_s: float) -> dict:
    """Median time (ms) and peak memory growth (MiB) of one case, in this process."""
    import torch

    torch.manual_seed(0)
    run = _op_run(case) if case["kind"] == "op" else _bench_run(case)
    if run is None:
        return {"status": "n/a"}
    base = _rss_mb()
    start = time.perf_counter()
    run()  # warm-up: sets the peak (a first AdamW step also makes the optimizer's moments)
    times = [time.perf_counter() - start]
    if not case.get("memory_only"):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
            if time.perf_counter() - start > budget_s / 2:  # leave the rest of the budget unused
                break
    return {"status": "ok", "median_ms": 1000 * statistics.median(times), "peak_mb": _rss_mb() - base,
            "runs": len(times)}


# --- the run: one process per case, stopped over its budget -----------------------------------

def _watch(cmd: list[str], env: dict, budget_s: float, memory_mb: float) -> tuple[str, str]:
    """(status, stdout) of a child: "ok", "over budget", "over memory" or "failed: …"."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, status = time.monotonic() + budget_s, None
    while proc.poll() is None:
        if time.monotonic() > deadline:
            status = f"over budget ({budget_s:.0f} s)"
        elif _child_rss_mb(proc.pid) > memory_mb:
            status = f"over memory ({memory_mb:.0f} MiB)"
        if status:
            proc.kill()
            proc.communicate()
            return status, ""
        time.sleep(0.1)
    out, err = proc.communicate()
    if proc.returncode != 0:
        return f"failed: {(err.strip().splitlines() or ['no output'])[-1]}", ""
    return "ok", out


def _child_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_all(src: Path, *, threads: int, repeats: int, budget_s: float, memory_mb: float, smoke: bool,
            only: list[str] | None = None, progress=print) -> dict:
    """Every case of :func:`plan` (those named in ``only``, if given) against the tree ``src``;
    the run's JSON payload."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    records, stopped = [], set()
    for case in plan(smoke):
        if only and case["name"] not in only:
            continue
        if case["name"] in stopped:
            record = {**case, "status": "not run: over at a shorter length"}
        else:
            budget = budget_s * case.get("budget_factor", 1)
            cmd = [sys.executable, str(Path(__file__).resolve()), "--case", json.dumps(case), "--threads",
                   str(threads), "--repeats", str(repeats), "--budget-s", str(budget)]
            status, out = _watch(cmd, env, budget, memory_mb)
            record = {**case, **(json.loads(out.strip().splitlines()[-1]) if status == "ok" else {"status": status})}
            if record["status"].startswith("over"):
                stopped.add(case["name"])
        records.append(record)
        progress(f"{case['name']:16s} L={case['length']:<6d} {_cell(record)}")
    return {"src": str(src), "threads": threads, "repeats": repeats, "budget_s": budget_s,
            "memory_limit_mb": memory_mb, "smoke": smoke, "load_1min": os.getloadavg()[0], "records": records}


# --- the table ---------------------------------------------------------------------------------

def _cell(r: dict | None) -> str:
    if r is None:
        return "–"
    if r["status"] != "ok":
        return r["status"]
    return f"{r['median_ms']:,.0f} ms, {r['peak_mb']:,.0f} MiB"


def _ratio(r: dict | None, base: dict | None, key: str) -> float | None:
    if not r or not base or r.get("status") != "ok" or base.get("status") != "ok" or base[key] <= 0:
        return None
    return r[key] / base[key]


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def render(before: dict, after: dict) -> str:
    """The Markdown table of two runs: each case before → after, its ratio to the row it is
    measured against (softmax at the same length, APE's model or layer) and the target."""
    def index(payload):
        return {(r["name"], r["length"]): r for r in payload["records"]}

    old, new = index(before), index(after)
    lines = ["| case | L | before | after | time ratio before → after | memory ratio before → after "
             "| target (time, memory) | verdict |", "|---|---|---|---|---|---|---|---|"]
    for (name, n), r in new.items():
        b = old.get((name, n))
        family = name.removesuffix("-old")
        target = TARGETS.get(family)
        base_name = target[2] if target else None
        base_new = new.get((base_name, n)) if base_name else None
        base_old = old.get((base_name, n)) if base_name else None
        rt = (_ratio(b, base_old, "median_ms"), _ratio(r, base_new, "median_ms"))
        rm = (_ratio(b, base_old, "peak_mb"), _ratio(r, base_new, "peak_mb"))
        goal, verdict = "–", "–"
        if name == "model path-fox":
            goal = f"≤ {PATH_FOX_MEMORY_TARGET_MB:,} MiB"
            if r.get("status") == "ok":
                verdict = "met" if r["peak_mb"] <= PATH_FOX_MEMORY_TARGET_MB else "missed"
        elif target and not name.endswith("-old"):
            goal = f"≤ {target[0]}×" + (f", ≤ {target[1]}×" if target[1] else "")
            if rt[1] is not None:
                ok = rt[1] <= target[0] and (target[1] is None or (rm[1] is not None and rm[1] <= target[1]))
                verdict = "met" if ok else "missed"
        ratios = [f"{_fmt(x)} → {_fmt(y)}" if base_name else "–" for x, y in (rt, rm)]
        lines.append(f"| {name} | {n:,} | {_cell(b)} | {_cell(r)} | {ratios[0]} | {ratios[1]} | {goal} | {verdict} |")
    head = (f"Before: `{before['src']}`, after: `{after['src']}`; {after['threads']} thread(s), median of "
            f"{after['repeats']} runs after a warm-up, at most {after['budget_s']:.0f} s and "
            f"{after['memory_limit_mb']:,.0f} MiB a case; 1-minute load at the end: "
            f"{before.get('load_1min', float('nan')):.2f} / {after.get('load_1min', float('nan')):.2f}. Ratios are "
            "to softmax at the same L (kernels) and to APE (model, layer).")
    return head + "\n\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the source tree to measure (its src/)")
    parser.add_argument("--out", type=Path, help="where to write the run's JSON")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=45.0,
                        help="the most seconds one case may take (the 16,384-token PaTH-FoX step: 3×)")
    parser.add_argument("--memory-limit-mb", type=float, default=12000.0,
                        help="the most resident memory one case may hold")
    parser.add_argument("--smoke", action="store_true", help="every case at tiny sizes")
    parser.add_argument("--only", help="comma-separated case names (e.g. 'fox,layer convspe'): those cases alone")
    parser.add_argument("--render", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                        help="write the table of two runs' JSON into --doc's generated block")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "bench" / "cpu.md")
    parser.add_argument("--profile", metavar="NAME:L",
                        help="profile one case in this process (e.g. path-fox:2048): each operator's share of "
                             "its self CPU time")
    parser.add_argument("--rows", type=int, default=15, help="--profile: operators listed (default 15)")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        return _main(args)
    except ValueError as err:  # a user error: one line, exit 2
        print(f"engine4_cost.py: {err}", file=sys.stderr)
        return 2


def _main(args) -> int:
    for flag, value in (("--threads", args.threads), ("--repeats", args.repeats), ("--budget-s", args.budget_s),
                        ("--memory-limit-mb", args.memory_limit_mb)):
        if value <= 0:
            raise ValueError(f"{flag} must be positive, got {value}")
    if args.profile:
        case = _find_case(args.profile, args.smoke)
        import torch

        torch.set_num_threads(args.threads)
        shares = profile_case(case, args.rows)
        if not shares:
            raise ValueError(f"--profile {args.profile!r}: this tree has no such form")
        print(f"{case['name']} L={case['length']}, {args.threads} thread(s): share of self CPU time")
        for key, share, calls in shares:
            print(f"{100 * share:6.1f} %  {calls:7d} calls  {key}")
        return 0
    if args.case:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(measure_case(json.loads(args.case), args.repeats, args.budget_s)))
        return 0
    if args.render:
        missing = [str(path) for path in args.render if not path.is_file()]
        if missing:
            raise ValueError(f"--render: {', '.join(missing)} does not exist")
        runs = []
        for path in args.render:
            runs.append(json.loads(path.read_text()))
            if not isinstance(runs[-1], dict) or "records" not in runs[-1]:
                raise ValueError(f"--render: {path} is not a run of this script (no records)")
        text = args.doc.read_text() if args.doc.is_file() else ""
        if BEGIN not in text or END not in text:
            raise ValueError(f"--doc {args.doc}: no {BEGIN} … {END} block to write")
        replace_block(args.doc, BEGIN, END, render(*runs))
        print(f"wrote the table into {args.doc}")
        return 0
    if not (args.src / "spe").is_dir():
        raise ValueError(f"--src {args.src}: no spe package there (give a checkout's src/)")
    names = {case["name"] for case in plan()}
    only = [name.strip() for name in args.only.split(",")] if args.only else None
    unknown = sorted(set(only or []) - names)
    if unknown:
        raise ValueError(f"--only {', '.join(unknown)}: no such case (cases: {', '.join(sorted(names))})")
    if args.out is None:
        raise ValueError("--out FILE.json is required for a run")
    if args.out.exists():
        raise ValueError(f"--out {args.out} exists: give a new file")
    payload = run_all(args.src.resolve(), threads=args.threads, repeats=args.repeats, budget_s=args.budget_s,
                      memory_mb=args.memory_limit_mb, smoke=args.smoke, only=only,
                      progress=lambda line: print(line, file=sys.stderr, flush=True))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

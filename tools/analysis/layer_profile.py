"""Where one causal attention layer's forward+backward spends its time, and what torch.compile
changes: ``python tools/analysis/layer_profile.py --device cuda --length 16384``.

The layer and its settings are ``spe bench``'s (:func:`spe.lab.bench.worker.build`; batch 2,
8 heads × 64, R = 64, K = 5, P = 128, 64 FAVOR+ features, chunks of 64). For each
POSITIONAL+ATTENTION pair: the median time of eager and of ``torch.compile``-d steps (in one
process, so the ratio is what to read), then the profiler's operators of one eager step by
self device time. One JSON line per case on stdout, then the tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from spe.lab.bench.run import parse_pairs
from spe.lab.bench.worker import build


def _step(case: dict, device: torch.device, compiled: bool):
    layer, encoding, ape = build(case, device)
    n, b = case["length"], case["batch"]
    x = torch.randn(b, n, case["num_heads"] * case["head_dim"], device=device, requires_grad=True)
    g = torch.Generator().manual_seed(0)
    forward = torch.compile(layer) if compiled else layer

    def run() -> None:
        inp = ape(x, torch.arange(n, device=device)) if ape is not None else x
        code = encoding(n, generator=g) if encoding is not None else None
        forward(inp, code).float().square().mean().backward()
        for p in [*layer.parameters(), x, *(encoding.parameters() if encoding is not None else [])]:
            p.grad = None
    return run


def _median_ms(run, device: torch.device, repeats: int) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    run()
    run()  # compilation and autotuning happen in the first calls
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--pairs", default="ape+performer,sinespe+performer,sinespe:blocked+performer")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=15)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    tables = []
    for pos, impl, attention in parse_pairs(args.pairs):
        case = dict(mode="train", positional=pos, impl=impl, attention=attention, batch=2, num_heads=8, head_dim=64,
                    num_realizations=64, num_sines=5, kernel_size=128, num_features=64, chunk_size=64,
                    length=args.length, decay="none", precision="fp32", repeats=args.repeats)
        record = {"pair": f"{pos}:{impl}+{attention}", "length": args.length, "device": str(device),
                  "eager_ms": _median_ms(_step(case, device, False), device, args.repeats)}
        if not args.no_compile:
            try:
                record["compiled_ms"] = _median_ms(_step(case, device, True), device, args.repeats)
            except Exception as err:  # noqa: BLE001 - a failed compilation is a result to report
                record["compile_error"] = f"{type(err).__name__}: {str(err)[:200]}"
        print(json.dumps(record), flush=True)
        run = _step(case, device, False)
        run()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            run()
            if device.type == "cuda":
                torch.cuda.synchronize()
        key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        tables.append(f"## {record['pair']} N={args.length}\n" + prof.key_averages().table(sort_by=key, row_limit=args.rows))
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())

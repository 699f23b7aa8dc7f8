"""The cost table of docs/path.md: PaTH (and PaTH-FoX) beside softmax (and FoX), one thread.

Run from the repository root (a minute or two on a shared 2-core machine)::

    OMP_NUM_THREADS=1 PYTHONPATH=src python tools/analysis/path_cost.py

Forward, and forward + backward of (y²).sum(), B = 1, H = 4, D = 64, float32, best of 3 after a
warm-up; "peak" is the growth of the process's maximum resident memory (MiB) over the warm-up
forward + backward, each row in a fresh process (so each peak is its own). Prints the table's rows.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

LENGTHS = (512, 2048)
KERNELS = ("softmax", "fox", "path", "path-fox")


def measure(kernel: str, n: int, b: int = 1, h: int = 4, d: int = 64) -> str:
    from spe.ops import path_attention, softmax_attention

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, n, h, d, generator=g).requires_grad_() for _ in range(3))
    w = F.normalize(torch.randn(b, n, h, d, generator=g), dim=-1).requires_grad_()
    beta = (2 * torch.rand(b, n, h, generator=g)).requires_grad_()
    gate = (0.1 * torch.rand(b, n, h, generator=g).log()).requires_grad_() if kernel.endswith("fox") else None

    def run():
        if kernel in ("softmax", "fox"):
            return softmax_attention(q, k, v, causal=True, log_decay=gate)
        return path_attention(q, k, v, w, beta, log_decay=gate)

    def once(backward: bool) -> float:
        start = time.perf_counter()
        y = run()
        if backward:
            y.square().sum().backward()
        return time.perf_counter() - start

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    once(True)  # warm-up; sets the peak
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024  # KiB → MiB (Linux)
    forward = min(once(False) for _ in range(3))
    both = min(once(True) for _ in range(3))
    return f"| {kernel} | {n} | {1e3 * forward:.0f} | {1e3 * both:.0f} | {peak:.0f} |"


if __name__ == "__main__":
    if len(sys.argv) == 3:
        print(measure(sys.argv[1], int(sys.argv[2])))
    else:
        print("| kernel | L | forward (ms) | forward + backward (ms) | peak (MiB) |\n|---|---|---|---|---|")
        for n in LENGTHS:
            for kernel in KERNELS:
                out = subprocess.run([sys.executable, __file__, kernel, str(n)], capture_output=True,
                                     text=True, check=True)
                print(out.stdout.strip())

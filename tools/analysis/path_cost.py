"""The cost table of docs/path.md: PaTH (and PaTH-FoX) beside softmax (and FoX), one thread.

Run from the repository root (a minute or two on a shared 2-core machine)::

    OMP_NUM_THREADS=1 PYTHONPATH=src python tools/analysis/path_cost.py
    PYTHONPATH=src python tools/analysis/path_cost.py --device cuda   # L = 2,048 to 16,384

Forward, and forward + backward of (y²).sum(), B = 1, H = 4, D = 64, float32, best of 3 after a
warm-up; "peak" is the growth of the process's maximum resident memory (MiB) over the warm-up
forward + backward (on CUDA: the peak of allocated GPU memory), each row in a fresh process (so
each peak is its own; a row over 120 s is reported as such). Prints the table's rows.

FoX has three rows: ``fox`` what ``softmax_attention`` picks (the flash-style form from
``FLASH_FOX_MIN_LENGTH`` positions on), ``fox-bias`` the (B, H, L, L) gate term (in blocks of
``FOX_QUERY_BLOCK`` queries beyond that length), ``fox-flash`` ``flash_fox_attention`` itself. One
row: ``python tools/analysis/path_cost.py fox-flash 256``. PaTH and PaTH-FoX likewise: ``path``
what ``path_attention`` picks (flash-style from ``FLASH_MIN_LENGTH`` positions on), ``-chunk`` the
chunked form (the (B, H, L, L) logits), ``-flash`` the flash-style form.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

LENGTHS = {"cpu": (512, 2048), "cuda": (2048, 8192, 16384)}
KERNELS = ("softmax", "fox", "fox-bias", "fox-flash", "path", "path-chunk", "path-flash", "path-fox",
           "path-fox-chunk", "path-fox-flash")


def measure(kernel: str, n: int, device: str = "cpu", b: int = 1, h: int = 4, d: int = 64) -> str:
    from spe.ops import path_attention, softmax_attention

    torch.set_num_threads(1)
    cuda = device == "cuda"
    g = torch.Generator().manual_seed(0)

    def leaf(t):
        return t.to(device).requires_grad_()

    q, k, v = (leaf(torch.randn(b, n, h, d, generator=g)) for _ in range(3))
    w = leaf(F.normalize(torch.randn(b, n, h, d, generator=g), dim=-1))
    beta = leaf(2 * torch.rand(b, n, h, generator=g))
    gate = leaf(0.1 * torch.rand(b, n, h, generator=g).log()) if "fox" in kernel else None
    if kernel == "fox-bias":  # the gate term as a tensor at every length (this process only)
        import spe.ops.softmax.chunk as chunk

        chunk.FLASH_FOX_MIN_LENGTH = n + 1

    def run():
        if kernel == "fox-flash":
            from spe.ops.softmax import flash_fox_attention

            return flash_fox_attention(q, k, v, gate)
        if kernel in ("softmax", "fox", "fox-bias"):
            return softmax_attention(q, k, v, causal=True, log_decay=gate)
        impl = kernel.rpartition("-")[2]
        return path_attention(q, k, v, w, beta, log_decay=gate, impl=impl if impl in ("chunk", "flash") else "auto")

    def once(backward: bool) -> float:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        y = run()
        if backward:
            y.square().sum().backward()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    once(True)  # warm-up; sets the peak
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024  # KiB → MiB (Linux)
    forward = min(once(False) for _ in range(3))
    both = min(once(True) for _ in range(3))
    return f"| {kernel} | {n} | {1e3 * forward:.0f} | {1e3 * both:.0f} | {peak:.0f} |"


if __name__ == "__main__":
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"
    if device not in LENGTHS:
        sys.exit(f"path_cost.py: --device {device!r}: expected one of {', '.join(LENGTHS)}")
    args = [a for a in sys.argv[1:] if a not in ("--device", device)]
    if len(args) == 2:
        print(measure(args[0], int(args[1]), device))
    else:
        print("| kernel | L | forward (ms) | forward + backward (ms) | peak (MiB) |\n|---|---|---|---|---|")
        for n in LENGTHS[device]:
            for kernel in KERNELS:
                try:
                    out = subprocess.run([sys.executable, __file__, kernel, str(n), "--device", device],
                                         capture_output=True, text=True, check=True, timeout=120)
                    print(out.stdout.strip(), flush=True)
                except subprocess.TimeoutExpired:
                    print(f"| {kernel} | {n} | over 120 s | | |", flush=True)

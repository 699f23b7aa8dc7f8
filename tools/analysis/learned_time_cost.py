"""The cost table of docs/learned-time.md: learned time beside index time and APE.

Run from the repository root, with nothing else running::

    PYTHONPATH=src python tools/analysis/learned_time_cost.py

On a GPU: a causal LM of d_model 256, 8 heads, 4 layers, d_ff 1,024 (R = 32, K = 5) on batch
8 × 2,048 tokens under bf16 autocast. On a CPU (two threads): d_model 128, 4 heads, 2 layers,
d_ff 512 on batch 4 × 512, float32. The training step (forward + backward) is timed in 8
rounds that cycle through the rows, so that a change in the machine's load hits every row
alike; the median of the last 6 and its ratio to APE's are reported, with the peak memory of
those steps (GPU), the activations a forward keeps for backward (MiB, any device: the bytes of
the distinct storages autograd saves, parameters excluded) and one decoding step after a
prefill of 512 or 16,384 tokens (64 or 1,024 on a CPU; batch 1, median of 30). The learned-time
sineSPE rows run twice: eagerly, then with the timed product's elementwise passes compiled
(``spe.ops.sine.timed.COMPILE``, what ``spe train --compile`` turns on; "compiled": true). Prints
one JSON line per row.
"""

import json
import statistics
import time

import torch

from spe.models import DecoderLM, ModelConfig
from spe.ops.sine import timed

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
small = dev.type == "cpu"
if small:
    torch.set_num_threads(2)
B, L = (4, 512) if small else (8, 2048)
PREFILLS = (64, 1024) if small else (512, 16384)
common = dict(vocab_size=512, d_model=128 if small else 256, num_heads=4 if small else 8,
              num_layers=2 if small else 4, d_ff=512 if small else 1024, dropout=0.0)
rows = [("ape", "linear", {}), ("sinespe", "linear", {}), ("sinespe", "linear", {"spe_time": "learned"}),
        ("sinespe", "linear", {"decay": "gated"}), ("sinespe", "linear", {"decay": "gated", "spe_time": "learned"}),
        ("rope", "linear-elu", {}), ("rope", "linear-elu", {"rope_time": "learned"}),
        ("sinespe", "performer", {}), ("sinespe", "performer", {"spe_time": "learned"})]
# the learned-time sineSPE rows again with the timed product's elementwise passes compiled
# (spe.ops.sine.timed.COMPILE, as spe train --compile sets it; the compile falls in the
# untimed first rounds)
COMPILED = {i for i, (_, _, extra) in enumerate(rows) if extra.get("spe_time") == "learned"}
rows += [rows[i] for i in sorted(COMPILED)]
compiled = [False] * (len(rows) - len(COMPILED)) + [True] * len(COMPILED)


def saved_mib(model) -> float:
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            model.loss(tok)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in params) / 2**20


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


models = []
for pos, att, extra in rows:
    torch.manual_seed(0)
    models.append(DecoderLM(ModelConfig(positional=pos, attention=att, **common, **extra)).to(dev).train())
tok = torch.randint(0, 512, (B, L + 1), device=dev)
times = [[] for _ in rows]
peaks = [0.0 for _ in rows]
for rnd in range(8):
    for i, m in enumerate(models):
        timed.COMPILE[dev.type] = compiled[i]
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = m.loss(tok)
        loss.backward()
        sync()
        times[i].append(time.perf_counter() - t0)
        m.zero_grad(set_to_none=True)
        if dev.type == "cuda" and rnd >= 2:
            peaks[i] = max(peaks[i], torch.cuda.max_memory_allocated() / 2**30)
steps = [statistics.median(t[2:]) * 1e3 for t in times]
for (pos, att, extra), m, step, peak, fused in zip(rows, models, steps, peaks, compiled):
    timed.COMPILE[dev.type] = fused
    saved = saved_mib(m)
    m.eval()
    dec = {}
    for p in PREFILLS:
        with torch.no_grad():
            _, st = m.prefill(torch.randint(0, 512, (1, p), device=dev))
            t = torch.randint(0, 512, (1,), device=dev)
            ts = []
            for _ in range(30):
                sync()
                t0 = time.perf_counter()
                m.step(t, st)
                sync()
                ts.append(time.perf_counter() - t0)
            dec[p] = round(statistics.median(ts) * 1e3, 3)
    row = dict(device=dev.type, positional=pos, attention=att, **extra, compiled=fused, step_ms=round(step, 2),
               x_ape=round(step / steps[0], 2), peak_gib=round(peak, 2), saved_mib=round(saved, 1), decode_ms=dec)
    print(json.dumps(row), flush=True)

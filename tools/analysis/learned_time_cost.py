"""The cost table of docs/learned-time.md: learned time beside index time and APE.

Run from the repository root, on a GPU machine (on a CPU it runs a small shape in seconds)::

    PYTHONPATH=src python tools/analysis/learned_time_cost.py

A causal LM of d_model 256, 8 heads, 4 layers, d_ff 1,024 (R = 32, K = 5) on batch 8 × 2,048
tokens under bf16 autocast: the training step (forward + backward, median of 6 after 2
warm-ups) and its peak memory, and one decoding step after a prefill of 512 or 16,384 tokens
(batch 1, median of 30). Prints one JSON line per row.
"""

import json
import time

import torch

from spe.models import ModelConfig, DecoderLM
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
small = dev.type == "cpu"
B, L = (2, 64) if small else (8, 2048)
common = dict(vocab_size=512, d_model=64 if small else 256, num_heads=4 if small else 8, num_layers=2 if small else 4,
              d_ff=128 if small else 1024, dropout=0.0)
rows = [("ape", "linear", {}), ("sinespe", "linear", {}), ("sinespe", "linear", {"spe_time": "learned"}),
        ("sinespe", "linear", {"decay": "gated"}), ("sinespe", "linear", {"decay": "gated", "spe_time": "learned"}),
        ("rope", "linear-elu", {}), ("rope", "linear-elu", {"rope_time": "learned"}),
        ("sinespe", "performer", {}), ("sinespe", "performer", {"spe_time": "learned"})]
def sync():
    if dev.type == "cuda": torch.cuda.synchronize()
for pos, att, extra in rows:
    torch.manual_seed(0)
    m = DecoderLM(ModelConfig(positional=pos, attention=att, **common, **extra)).to(dev).train()
    tok = torch.randint(0, 512, (B, L + 1), device=dev)
    times = []
    if dev.type == "cuda": torch.cuda.reset_peak_memory_stats()
    for i in range(8):
        sync(); t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = m.loss(tok)
        loss.backward()
        sync(); times.append(time.perf_counter() - t0)
        m.zero_grad(set_to_none=True)
    mem = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else 0
    m.eval()
    dec = {}
    for p in ((16, 64) if small else (512, 16384)):
        with torch.no_grad():
            _, st = m.prefill(torch.randint(0, 512, (1, p), device=dev))
            t = torch.randint(0, 512, (1,), device=dev)
            ts = []
            for i in range(30):
                sync(); t0 = time.perf_counter(); _, s2 = m.step(t, st); sync(); ts.append(time.perf_counter() - t0)
            dec[p] = sorted(ts)[len(ts) // 2] * 1e3
    row = dict(positional=pos, attention=att, **extra, step_ms=sorted(times[2:])[len(times[2:]) // 2] * 1e3,
               peak_gib=round(mem, 2), decode_ms=dec)
    print(json.dumps(row), flush=True)

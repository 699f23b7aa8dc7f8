"""How large the blocked sineSPE products' blocks should be on a GPU: one process, JSON lines.

``python tools/analysis/block_scale.py --scales 1,16,64,256`` sets the GPU budget of each
product in :data:`spe.ops.sine.costs.BLOCK_ELEMENTS` to each scale times its CPU budget in turn
and times

* one layer's forward + backward (``spe bench``'s train case: batch 2, 8 heads × 64, R = 64,
  K = 5, linear attention, float32, median of 5) with the fused and with the batch-shared
  (``blocked``) index product, at N = 2,048 and 16,384;
* one training step of learned-time sineSPE + linear attention (the model of
  ``tools/analysis/learned_time_cost.py`` on a GPU: d_model 256, 8 heads, 4 layers, batch
  8 × 2,048, bf16 autocast; median of 6 after 2 warm-ups);

with APE's layer and model beside them for the ratios. Scale 1 is the CPU's block size; the
defaults in ``BLOCK_ELEMENTS`` are the best scale of each product in docs/bench.md's run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import spe.ops.sine.costs as costs
from spe.lab.bench.worker import measure_train
from spe.models import DecoderLM, ModelConfig


def layer_ms(positional: str, impl: str, n: int, device: torch.device) -> float:
    case = dict(mode="train", positional=positional, impl=impl, attention="linear", batch=2, num_heads=8,
                head_dim=64, num_realizations=64, num_sines=5, kernel_size=128, num_features=64, chunk_size=64,
                length=n, decay="none", precision="fp32", repeats=5, softmax_impl="auto", max_seconds=20.0)
    return measure_train(case, device)["median_ms"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_ms(extra: dict, device: torch.device) -> float:
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(attention="linear", vocab_size=512, d_model=256, num_heads=8, num_layers=4,
                                  d_ff=1024, dropout=0.0, **extra)).to(device).train()
    tokens = torch.randint(0, 512, (8, 2049), device=device)
    times = []
    for _ in range(8):
        sync(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model.loss(tokens)
        loss.backward()
        sync(device)
        times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return statistics.median(times[2:]) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--scales", default="1,16,64,256")
    parser.add_argument("--lengths", default="2048,16384")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    lengths = [int(x) for x in args.lengths.split(",")]
    ape = {n: layer_ms("ape", "auto", n, device) for n in lengths}
    ape_model = model_ms({"positional": "ape"}, device)
    print(json.dumps({"ape_layer_ms": {n: round(v, 2) for n, v in ape.items()}, "ape_model_ms": round(ape_model, 2)}),
          flush=True)
    for scale in (int(x) for x in args.scales.split(",")):
        for product, (cpu, _) in list(costs.BLOCK_ELEMENTS.items()):
            costs.BLOCK_ELEMENTS[product] = (cpu, cpu * scale)
        row: dict = {"scale": scale}
        for impl in ("fused", "blocked"):
            for n in lengths:
                ms = layer_ms("sinespe", impl, n, device)
                row[f"{impl}_{n}"] = [round(ms, 2), round(ms / ape[n], 2)]
        ms = model_ms({"positional": "sinespe", "spe_time": "learned"}, device)
        row["learned_model"] = [round(ms, 2), round(ms / ape_model, 2)]
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

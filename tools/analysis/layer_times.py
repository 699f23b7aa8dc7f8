"""One layer's forward+backward time and peak memory for several cases in ONE process, printed
as JSON lines as each finishes (a run cut short keeps what it measured):
``python tools/analysis/layer_times.py --device cuda --lengths 2048,16384``.

The cases are ``spe bench``'s train cases (:func:`spe.lab.bench.worker.measure_train`; batch 2,
8 heads × 64, R = 64, K = 5, P = 128, 64 FAVOR+ features, chunks of 64), given as
POSITIONAL+ATTENTION[+DECAY][@SOFTMAX_IMPL], e.g. ``none+softmax+gated@flex``. ``spe bench``
runs each case in a fresh process (the figures docs/bench.md reports); this is the quick
look that fits a few minutes of GPU time.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from spe.lab.bench.run import parse_pairs
from spe.lab.bench.worker import measure_train

DEFAULT = ("ape+performer,sinespe+performer,none+softmax+gated@blocks,none+softmax+gated@flex,"
           "convspe+performer,convspe:materialized+performer")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--lengths", default="2048,16384")
    parser.add_argument("--cases", default=DEFAULT)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    for n in (int(x) for x in args.lengths.split(",")):
        for entry in args.cases.split(","):
            entry, _, softmax_impl = entry.partition("@")
            parts = entry.split("+")
            decay = parts[2] if len(parts) > 2 else "none"
            (pos, impl, attention), = parse_pairs("+".join(parts[:2]))
            case = dict(mode="train", positional=pos, impl=impl, attention=attention, batch=2, num_heads=8,
                        head_dim=64, num_realizations=64, num_sines=5, kernel_size=128, num_features=64,
                        chunk_size=64, length=n, decay=decay, precision="fp32", repeats=args.repeats,
                        softmax_impl=softmax_impl or "auto", max_seconds=20.0)
            try:
                result = measure_train(case, device)
                record = {"case": entry + (f"@{softmax_impl}" if softmax_impl else ""), "length": n,
                          "median_ms": round(result["median_ms"], 2), "peak_mb": round(result["peak_mb"], 1)}
            except Exception as err:  # noqa: BLE001 - one failing case is a result, the others still run
                record = {"case": entry, "length": n, "error": f"{type(err).__name__}: {str(err)[:300]}"}
            print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where one AdamW step of the whole model spends its time: ``python -m spe.lab.bench.profile
'<json case>' [rows]`` prints torch.profiler's operators sorted by self CPU time.

The case is a ``--modes model`` case of :mod:`spe.lab.bench.worker` (model options, vocab_size,
positional, impl, attention, batch, length); one warm-up step, then one profiled step.
"""

from __future__ import annotations

import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from spe.lab.bench.worker import model_step


def profile_step(case: dict, rows: int = 25) -> str:
    """The profiler's table of one AdamW step (after a warm-up step), with memory per operator."""
    torch.set_num_threads(case.get("threads") or torch.get_num_threads())
    run, _ = model_step(case, torch.device("cpu"))
    run()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


if __name__ == "__main__":
    print(profile_step(json.loads(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 25))

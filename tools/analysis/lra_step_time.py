"""Seconds per training step of cpu-small ListOps encoders, measured side by side.

Usage: python tools/analysis/lra_step_time.py [--rounds 5] [--steps 20] [--threads 1] [--json PATH]

The ListOps study's step-time target (the recommended SPE setting at most 1.5× APE + Performer) is a
benchmark, not a number read off training logs, whose intervals include validation and share
the machine with whatever else runs. Every setting below is the cpu-small ListOps classifier
(`preset_config("listops", ...)`) trained with AdamW on the same real batches of the training
split (32 examples, each batch cut to its longest expression, as `spe lra` does). Each round
times ``--steps`` full steps (forward, backward, clipping, update) of every setting in turn,
after two untimed warm-up steps; the table gives the median over rounds of seconds per step
and of the ratio to ``ape-performer`` taken within each round (these machines are shared and
noisy: compare ratios, quote medians). Run it with nothing else on the machine.
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from spe.lab.lra import build_classifier, load_splits, preset_config
from spe.lab.lra.evaluate import model_inputs

# name -> (positional, attention, model options beside the preset)
SETTINGS = {
    "ape-performer": ("ape", "performer", {}),
    "sinespe-performer, fresh code per step": ("sinespe", "performer", {"fixed_code": False}),
    "sinespe-performer, fixed code (preset)": ("sinespe", "performer", {}),
    "convspe-performer, fixed code (preset)": ("convspe", "performer", {}),
    "ape-linear-relu": ("ape", "linear-relu", {}),
    "sinespe-linear-relu, fixed code (preset)": ("sinespe", "linear-relu", {}),
    "none-performer + gate (bidirectional)": ("none", "performer", {"decay": "gated"}),
    "none-linear-elu + channel gate (bidirectional)": ("none", "linear-elu", {"decay": "gated-channel"}),
    "sinespe-performer + gate, fixed code": ("sinespe", "performer", {"decay": "gated"}),
}
REFERENCE = "ape-performer"


def build(positional: str, attention: str, options: dict, splits: dict):
    cfg = preset_config("listops", positional, attention, model=options)
    torch.manual_seed(0)
    model = build_classifier(cfg, splits["train"]).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return cfg, model, optimizer


def step(model, optimizer, batch, generator: torch.Generator) -> None:
    inputs, labels = batch
    loss = F.cross_entropy(model(*inputs, generator=generator), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per setting and round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default="runs/lra/step-time.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    splits = load_splits(preset_config("listops", "ape", "performer"))
    train = splits["train"]
    index = torch.Generator().manual_seed(0)
    batches = [model_inputs(train, torch.randint(len(train), (32,), generator=index), "cpu")
               for _ in range(args.steps + 2)]
    built = {name: build(*spec, splits) for name, spec in SETTINGS.items()}
    seconds = {name: [] for name in SETTINGS}
    for _ in range(args.rounds):
        for name, (cfg, model, optimizer) in built.items():
            generator = torch.Generator().manual_seed(1)
            for batch in batches[:2]:
                step(model, optimizer, batch, generator)
            start = time.perf_counter()
            for batch in batches[2:]:
                step(model, optimizer, batch, generator)
            seconds[name].append((time.perf_counter() - start) / args.steps)
    rows = []
    for name in SETTINGS:
        ratios = [s / r for s, r in zip(seconds[name], seconds[REFERENCE])]
        rows.append({"setting": name, "positional": SETTINGS[name][0], "attention": SETTINGS[name][1],
                     "model": built[name][0].model, "seconds_per_step": statistics.median(seconds[name]),
                     "ratio": statistics.median(ratios), "rounds": seconds[name]})
    print(f"| setting | s/step (median of {args.rounds}) | × {REFERENCE} |\n| --- | --- | --- |")
    for row in rows:
        print(f"| {row['setting']} | {row['seconds_per_step']:.4f} | {row['ratio']:.2f}× |")
    doc = {"command": " ".join(["python", *sys.argv]), "threads": args.threads, "steps": args.steps,
           "rounds": args.rounds, "batch_size": 32, "rows": rows}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

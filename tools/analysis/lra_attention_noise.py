"""How much a trained ListOps encoder's attention moves between two SPE codes or two FAVOR+ draws.

Usage: python tools/analysis/lra_attention_noise.py [--study runs/lra/listops-study] [--seed 0]
       [--rows ape-performer,ape-redraw,sinespe-performer,fixed-code,sinespe-softmax]
       [--examples 64] [--draws 4] [--json runs/lra/attention-noise.json]

The ListOps study (docs/lra.md) found that sineSPE + Performer learns ListOps with one fixed code and not with
a fresh code per step, while SPE + softmax (fresh codes) and APE + Performer with its
projections redrawn at every step both learn. This measures, on the best checkpoint of each
row (the study's folders), the attention weights w_m = (w_mn)_n of every real query m, head
and layer on validation expressions, as the layer's own kernel forms them (the layer's
``attention_weights``; FAVOR+: the projections and key scales of the layer; softmax:
softmax(q·k/√E) with the layer's terms), and reports mean total variation distances
½ Σ_n |w_mn − w'_mn| between

* **code**: two SPE codes (what changes from one training step to the next with fresh codes;
  for a fixed-code model, what a fresh code would do to it);
* **features**: two FAVOR+ projections, same code;
* **vs exact**: the layer's FAVOR+ weights and the exact exp(q̂·k̂/√E) weights FAVOR+
  estimates, same code (the features' error);
* **code, exact**: two codes through the exact kernel (SPE's own Monte-Carlo noise).

and the test accuracy of the checkpoint with the code it was evaluated with (``code_seed``, the
one its best checkpoint was also chosen with), with ``--draws`` other codes (mean of their
accuracies) and with the class probabilities averaged over those codes: does a model rely on
its own code (an absolute pattern) or only on the kernel every code shares?

Means over ``--draws`` pairs of draws. Dropout off (eval mode); the generators are explicit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from spe.checkpoint import load
from spe.lab.lra import LRAConfig, load_splits
from spe.lab.lra.evaluate import model_inputs


def capture(model, inputs, generator):
    """Per layer: (attention module, its input x, code, key padding mask, positions)."""
    seen, handles = [], []
    for block in model.blocks:
        def hook(module, args, kwargs, _seen=seen):
            _seen.append((module, args[0], args[1] if len(args) > 1 else kwargs.get("code"),
                          kwargs.get("key_padding_mask"), kwargs.get("positions")))
        handles.append(block.attn.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        model.encode(*inputs, generator=generator)
    finally:
        for h in handles:
            h.remove()
    return seen


def weights(attn, x, code, mask, positions, *, exact: bool) -> torch.Tensor:
    """(B, H, L, L) attention weights of every query over the real keys (float64): the layer's
    own (exact: the softmax attention of its q̂, k̂, which FAVOR+ estimates)."""
    return attn.attention_weights(x, code, positions=positions, key_padding_mask=mask, exact=exact,
                                  dtype=torch.float64)


def tv(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over real queries (and heads) of ½ Σ_n |a_mn − b_mn|."""
    per_query = 0.5 * (a - b).abs().sum(-1)  # (B, H, L)
    real = (~mask)[:, None, :].expand_as(per_query)
    return float(per_query[real].mean())


@torch.no_grad()
def measure(model, inputs, draws: int) -> dict:
    model.eval()
    performer = model.blocks[0].attn.kernel.random_features
    out = {"code": [], "code, exact": [], "features": [], "vs exact": []}
    stochastic = model.spec.stochastic if model.encoding is not None else False
    if model.config.fixed_code:  # what a fresh code would do to it: draw as a fresh-code model does
        model.config = dataclasses.replace(model.config, fixed_code=False)
    for i in range(draws):
        a = capture(model, inputs, torch.Generator().manual_seed(100 + 2 * i))
        b = capture(model, inputs, torch.Generator().manual_seed(101 + 2 * i))
        for (attn, x, code, mask, pos), (_, xb, code_b, _, _) in zip(a, b):
            if stochastic:
                out["code"].append(tv(weights(attn, x, code, mask, pos, exact=False),
                                      weights(attn, xb, code_b, mask, pos, exact=False), mask))
                out["code, exact"].append(tv(weights(attn, x, code, mask, pos, exact=True),
                                             weights(attn, xb, code_b, mask, pos, exact=True), mask))
            if performer:
                w = weights(attn, x, code, mask, pos, exact=False)
                out["vs exact"].append(tv(w, weights(attn, x, code, mask, pos, exact=True), mask))
                saved = attn.projection.clone()
                attn.redraw_features(torch.Generator().manual_seed(200 + i))
                out["features"].append(tv(w, weights(attn, x, code, mask, pos, exact=False), mask))
                attn.projection.copy_(saved)
    return {k: (sum(v) / len(v) if v else None) for k, v in out.items()}


@torch.no_grad()
def test_probabilities(model, test, batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) class probabilities in eval mode (the code from ``model.config.code_seed``), (N,) labels."""
    model.eval()
    probs, labels = [], []
    for start in range(0, len(test), batch_size):
        inputs, y = model_inputs(test, torch.arange(start, min(start + batch_size, len(test))), "cpu")
        probs.append(torch.softmax(model(*inputs).double(), -1))
        labels.append(y)
    return torch.cat(probs), torch.cat(labels)


def code_swap_accuracy(model, test, draws: int) -> dict:
    """Test accuracy (%) with the model's own evaluation code and, for SPE, with ``draws`` other
    codes: each alone (their mean) and together (probabilities averaged over the codes)."""
    probs, labels = test_probabilities(model, test)
    own = 100 * float((probs.argmax(-1) == labels).double().mean())
    if model.encoding is None or not model.spec.stochastic:
        return {"test, own code": own, "test, other codes": None, "test, codes averaged": None, "other codes": []}
    config, others, total = model.config, [], 0
    for i in range(draws):
        model.config = dataclasses.replace(config, code_seed=config.code_seed + 1000 + i)
        p, _ = test_probabilities(model, test)
        others.append(100 * float((p.argmax(-1) == labels).double().mean()))
        total = total + p
    model.config = config
    averaged = 100 * float((total.argmax(-1) == labels).double().mean())
    return {"test, own code": own, "test, other codes": sum(others) / len(others), "test, codes averaged": averaged,
            "other codes": others}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", default="runs/lra/listops-study")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", default="ape-performer,ape-redraw,sinespe-performer,fixed-code,sinespe-softmax")
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--draws", type=int, default=4)
    parser.add_argument("--json", default="runs/lra/attention-noise.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, splits = [], None
    for name in args.rows.split(","):
        folder = Path(args.study) / name
        if not (folder / f"seed{args.seed}" / "best").exists():
            print(f"skipping {name}: no {folder}/seed{args.seed}/best", file=sys.stderr)
            continue
        cfg = LRAConfig.from_dict(json.loads((folder / "config.json").read_text()))
        if splits is None:  # every row of the study reads the same validation split
            splits = load_splits(cfg)
        val = splits["val"]
        inputs, _ = model_inputs(val, torch.arange(min(args.examples, len(val))), "cpu")
        model = load(folder / f"seed{args.seed}" / "best", device="cpu").model
        swap = code_swap_accuracy(model, splits["test"], args.draws)
        rows.append({"row": name, "positional": cfg.positional, "attention": cfg.attention,
                     "fixed_code": bool(model.config.fixed_code), **measure(model, inputs, args.draws), **swap})
    cols = ["code", "code, exact", "features", "vs exact", "test, own code", "test, other codes",
            "test, codes averaged"]
    print("| row | " + " | ".join(cols) + " |\n| --- |" + " --- |" * len(cols))
    for r in rows:
        print(f"| {r['row']} | " + " | ".join("–" if r[c] is None else f"{r[c]:.3f}" if c in cols[:4]
                                          else f"{r[c]:.1f}" for c in cols) + " |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "seed": args.seed,
                                           "examples": args.examples, "draws": args.draws, "rows": rows}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

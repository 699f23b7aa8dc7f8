"""What the trained synthetic-task models did with their learned clock and their gates:
``PYTHONPATH=src python tools/analysis/clock_probe.py runs/mqar/sinespe-learned-gated ...``.

Each argument is a row folder of ``spe synth`` (``config.json`` and ``seed<k>/model.safetensors``).
Every finished seed's model (``result.json`` written) reads the first ``--sequences`` sequences
of the task's validation split at the training length L, once, in eval mode, and for each layer
and head reports:

* the learned clock's step Δ = softplus(wᵀx + b) (``--spe-time learned`` or ``--rope-time
  learned``; 1 everywhere is the index clock the models start from): its mean over every token,
  at the tokens that carry a loss (MQAR's queries, flip-flop's reads) and elsewhere, and the
  clock's span τ_{L−1} − τ_0 over the L tokens (L − 1 for the index clock);
* the forget gate's mean per token, exp of the log gate (scalar gate: per head; channel gate:
  the mean over its channels); 1 keeps the whole past;
* SPE's gate δ_d of eq. (23)–(25) of Liutkus et al. 2021 (model option ``gated``): its mean over
  the head's channels and its range (δ starts at sigmoid(``gate_init``), 0.5 by default).

One JSON line per (row, seed, layer) on stdout (``--json`` to a file instead), then a markdown
table of them per row and layer (:func:`summary_table`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch
from torch import Tensor

from spe.checkpoint import load
from spe.encodings.clock import LearnedClock
from spe.encodings.filter import SPEFilter
from spe.encodings.gates import ChannelGate, ScalarGate
from spe.lab.synth.config import SynthConfig
from spe.lab.synth.data import IGNORE
from spe.lab.synth.task import fixed_split, training_distribution


def probe(model: torch.nn.Module, tokens: Tensor, targets: Tensor) -> list[dict]:
    """Per layer (in the model's order of modules): the clock's steps, forget gates and SPE gates
    of ``model`` reading ``tokens`` (N, T), split by ``targets`` (N, T; IGNORE where no loss).

    Returns:
        One dict per layer that has a clock, a forget gate or an SPE gate: ``layer`` (its module
        name) and, each a list over heads, ``step_mean``, ``step_at_targets``, ``step_elsewhere``,
        ``clock_span`` (mean over sequences of τ_{T−1} − τ_0), ``forget_mean``, ``spe_gate_mean``,
        ``spe_gate_min``, ``spe_gate_max``; the keys of what the layer lacks are absent.
    """
    found: dict[str, dict] = {}
    scored = targets != IGNORE

    def layer_of(name: str) -> dict:
        block = re.match(r"(.*?blocks\.\d+)", name)  # clock, gates and filter of one block: one record
        return found.setdefault(block.group(1) if block else name, {})

    def on_clock(name):
        def hook(module, inputs, _output) -> None:
            delta = module.steps(inputs[0]).double()  # (N, T, H)
            layer_of(name).update(step_mean=delta.mean(dim=(0, 1)).tolist(),
                                  step_at_targets=delta[scored].mean(dim=0).tolist(),
                                  step_elsewhere=delta[~scored].mean(dim=0).tolist(),
                                  clock_span=delta[:, 1:].sum(dim=1).mean(dim=0).tolist())
        return hook

    def on_gate(name):
        def hook(_module, _inputs, log_gate) -> None:
            kept = log_gate.double().exp()
            per_head = kept.mean(dim=(0, 1)) if kept.dim() == 3 else kept.mean(dim=(0, 1, 3))
            layer_of(name)["forget_mean"] = per_head.tolist()
        return hook

    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, LearnedClock):
            hooks.append(module.register_forward_hook(on_clock(name)))
        elif isinstance(module, ScalarGate | ChannelGate):
            hooks.append(module.register_forward_hook(on_gate(name)))
        elif isinstance(module, SPEFilter) and module.gate is not None:
            delta = module.gate.detach().double()  # (H, D)
            layer_of(name).update(spe_gate_mean=delta.mean(dim=1).tolist(),
                                  spe_gate_min=delta.amin(dim=1).tolist(), spe_gate_max=delta.amax(dim=1).tolist())
    try:
        with torch.no_grad():
            model.eval()(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return [{"layer": name, **values} for name, values in found.items()]


def _config(folder: Path) -> SynthConfig:
    file = folder / "config.json"
    if not file.is_file():
        raise ValueError(f"{folder}: no config.json (give a row folder of spe synth)")
    return SynthConfig(**json.loads(file.read_text()))


def summary_table(lines: list[dict]) -> str:
    """A markdown table, one row per (row folder, layer): the clock's span over the L tokens
    (min–max over heads and seeds), its mean step at the targets and elsewhere, the forget gate's
    mean and SPE's δ (min–max), each over heads and seeds."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for line in lines:
        groups.setdefault((line["task"], line["row"], line["layer"]), []).append(line)

    def values(records: list[dict], key: str) -> list[float]:
        return [v for r in records for v in r.get(key, ())]

    def span(xs: list[float], digits: int) -> str:
        return "–" if not xs else f"{min(xs):.{digits}f}–{max(xs):.{digits}f}"

    def mean(xs: list[float]) -> str:
        return "–" if not xs else f"{sum(xs) / len(xs):.2f}"

    out = ["| task | row | layer | seeds | clock span over L | Δ at targets | Δ elsewhere | forget gate | SPE δ |",
           "|---|---|---|---|---|---|---|---|---|"]
    for (task, row, layer), records in groups.items():
        out.append(f"| {task} | {row} | {layer} | {len(records)} | {span(values(records, 'clock_span'), 1)} | "
                   f"{mean(values(records, 'step_at_targets'))} | {mean(values(records, 'step_elsewhere'))} | "
                   f"{mean(values(records, 'forget_mean'))} | "
                   f"{span(values(records, 'spe_gate_min') + values(records, 'spe_gate_max'), 2)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="row folders of spe synth")
    parser.add_argument("--sequences", type=int, default=64, help="validation sequences read (default 64)")
    parser.add_argument("--json", type=Path, help="write the JSON lines here instead of stdout")
    args = parser.parse_args(argv)
    if args.sequences < 1:
        parser.error(f"--sequences must be a positive integer, got {args.sequences}")
    if args.json is not None and args.json.exists():
        parser.error(f"--json {args.json} exists; give a new file")
    torch.set_num_threads(1)
    lines = []
    try:
        for folder in args.folders:
            cfg = _config(folder)
            tokens, targets = fixed_split(cfg, "validation", training_distribution(cfg.task), cfg.train_length)
            tokens, targets = tokens[:args.sequences], targets[:args.sequences]
            for seed_folder in sorted(folder.glob("seed*")):
                if not (seed_folder / "result.json").is_file():  # unfinished: its weights are not final
                    continue
                model = load(seed_folder / "model.safetensors").model
                for record in probe(model, tokens, targets):
                    lines.append({"row": folder.name, "seed": seed_folder.name, "task": cfg.task, **record})
    except (OSError, ValueError) as err:
        print(f"clock_probe: {err}", file=sys.stderr)
        return 1
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if args.json is not None:
        args.json.write_text(text)
    else:
        sys.stdout.write(text)
    print(summary_table(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

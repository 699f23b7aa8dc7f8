"""Writes the generated cost part of docs/peers.md.

Run after the ``spe bench`` run named in :data:`BENCH_COMMAND`::

    .venv/bin/python tools/docs/peers_doc.py [--runs runs/peers] [--doc docs/peers.md]

From ``--runs``/bench/bench.json: the cost table (one AdamW step of the main job's model and one
decoding step of each encoding, as ratios to APE, against the cost targets). The study's tables,
on Bach and on Palestrina, are generated from committed per-seed data by
``tools/docs/study_tables.py`` (blocks ``<!-- table:peers-bach -->`` and ``<!-- table:peers-palestrina -->``).
The prose around the blocks is written by a person after reading them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from doc_block import replace_block

BEGIN, END = "<!-- peers:begin (tools/docs/peers_doc.py) -->", "<!-- peers:end -->"
# One run, so that every cost is a ratio within it; the machine must be otherwise idle.
BENCH_COMMAND = ("spe bench --modes generate,model --lengths 512,2048,8192,16384 --batch-size 1 "
                 "--attentions performer --positionals ape,rope,sinespe,convspe,lrpe,permute,cosformer,none "
                 "--decay none,fixed --model-shapes 8x256 --rounds 3 --out runs/peers/bench")
TRAIN_LIMIT, FLAT_LIMIT = 1.5, 1.2  # the cost targets: ≤ 1.5× APE's step; "flat": 16,384 within 1.2× of 512
# (positional, decay) of the plan's variants; other pairs of the bench run keep a plain label
VARIANT_OF = {("ape", "none"): "ape", ("none", "fixed"): "decay", ("rope", "fixed"): "rope-decay",
              ("sinespe", "fixed"): "sinespe-decay"}


def _name(positional: str, decay: str) -> str:
    if (positional, decay) in VARIANT_OF:
        return VARIANT_OF[positional, decay]
    return positional if decay == "none" else f"{positional} + {decay} decay"


def cost_section(bench: dict) -> list[str]:
    """The cost table of one ``spe bench`` run (:data:`BENCH_COMMAND`): per encoding, the whole
    model's AdamW step at the main job's shape and the per-token decoding step of one layer at
    512 and 16,384 positions."""
    from spe.lab.bench.targets import record_decay

    model = {(r["positional"], record_decay(r)): r for r in bench.get("model", []) if r.get("rounds")}
    decode = {(r["positional"], record_decay(r), r["length"]): r for r in bench["records"]
              if r["mode"] == "generate" and "median_ms" in r}
    shape, layer = next(iter(model.values()), {}), bench.get("config", {})
    lines = ["### Cost of each encoding", "", "```bash", BENCH_COMMAND, "```", "",
             f"Training: one AdamW step of the whole main-job model (batch {shape.get('batch', '?')} × "
             f"{shape.get('length', '?')} tokens), median of {len(shape.get('times_ms', []))} steps over "
             f"{shape.get('rounds', '?')} interleaved rounds. Decoding: one recurrent step of one attention "
             f"layer ({layer.get('num_heads')} heads × {layer.get('head_dim')}, batch {layer.get('batch')}) with a "
             "state of N tokens. Target: training ≤ "
             f"{TRAIN_LIMIT}× APE; decoding flat (16,384 within {FLAT_LIMIT}× of 512).", "",
             "| encoding | train step ms | × APE | decode ms at 512 | at 16,384 | 16,384 / 512 | targets |",
             "|---|---|---|---|---|---|---|"]
    for pos, decay in dict.fromkeys([*model, *((p, d) for p, d, _ in decode)]):
        m, g0, g1 = model.get((pos, decay)), decode.get((pos, decay, 512)), decode.get((pos, decay, 16384))
        train = f"{m['median_ms']:.0f} | {m['time_vs_ape']:.2f}×" if m and "time_vs_ape" in m else "– | –"
        flat = g1["median_ms"] / g0["median_ms"] if g0 and g1 else None
        dec = (f"{g0['median_ms']:.2f} | {g1['median_ms']:.2f} | {flat:.2f}×" if flat is not None else "– | – | –")
        verdicts = []
        if m and "time_vs_ape" in m:
            verdicts.append("train " + ("met" if m["time_vs_ape"] <= TRAIN_LIMIT else "missed"))
        if flat is not None:
            verdicts.append("decode " + ("met" if flat <= FLAT_LIMIT else "missed"))
        lines.append(f"| {_name(pos, decay)} | {train} | {dec} | {', '.join(verdicts) or 'not measured'} |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs/peers")
    parser.add_argument("--doc", default="docs/peers.md")
    args = parser.parse_args()
    doc_path, bench = Path(args.doc), Path(args.runs) / "bench" / "bench.json"
    if not bench.exists():
        raise SystemExit(f"{bench} does not exist: run {BENCH_COMMAND!r} first")
    if not replace_block(doc_path, BEGIN, END, "\n".join(cost_section(json.loads(bench.read_text()))).rstrip()):
        raise SystemExit(f"{doc_path} lacks the markers {BEGIN} … {END}")
    print(f"wrote {doc_path}")


if __name__ == "__main__":
    main()

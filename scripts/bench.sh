#!/usr/bin/env bash
# The one `spe bench` run behind docs/bench/cpu.md (the speed and memory targets), then the page rendered from it.
# Usage: scripts/bench.sh [OUT]   (default runs/bench_final). Run it on an otherwise idle
# machine: every case is its own process, and its 1-minute load average is recorded.
set -eu
OUT=${1:-runs/bench_final}
PY=${PYTHON:-python}
$PY -m spe bench --modes train,generate,model \
  --lengths 512,1024,2048,4096,8192,16384 \
  --pairs ape+performer,ape+linear,ape+softmax,sinespe+performer,sinespe:fused+performer,sinespe:blocked+performer,sinespe:reference+performer,convspe+performer,convspe:materialized+performer,ape+performer-pytorch \
  --model-positionals ape,sinespe,sinespe:fused,sinespe:blocked,sinespe:materialized,convspe,convspe:materialized \
  --model-shapes 8x2048,2x8192 --rounds 2 \
  --longest ape,sinespe,convspe,ape+softmax --measure-limit-mb 9500 \
  --repeats 2 --budget-s 200 --threads 2 --out "$OUT"
$PY tools/docs/bench_doc.py "$OUT/bench.json" docs/bench/cpu.md

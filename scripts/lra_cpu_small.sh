#!/usr/bin/env bash
# The cpu-small LRA comparison behind docs/lra.md, one run at a time, resumable (rerun to continue).
# Usage: scripts/lra_cpu_small.sh [SEEDS] [OUT]   (default seeds 0, out runs/lra/cpu-small)
# One torch thread: on this 2-core machine shared with other jobs, two threads were up to 20×
# slower per step under load (thread oversubscription), one thread was not.
set -u
SEEDS=${1:-0}
OUT=${2:-runs/lra/cpu-small}
PY=${PYTHON:-python}
run() {  # task attention positional
  echo "$(date -u +%FT%TZ) start $1 $2 $3 seeds $SEEDS"
  $PY -m spe.cli.main -q lra --task "$1" --attention "$2" --positional "$3" --seeds "$SEEDS" --preset cpu-small \
      --threads 1 --no-progress --out "$OUT/$1-$2-$3" || echo "FAILED $1 $2 $3"
  echo "$(date -u +%FT%TZ) end $1 $2 $3"
}
for attention in performer linear-relu; do
  for positional in ape sinespe convspe; do run listops "$attention" "$positional"; done
done
run text performer sinespe
run retrieval performer sinespe
run image performer convspe-2d
run text performer ape
run retrieval performer ape
run image performer ape-learned
run image performer sinespe

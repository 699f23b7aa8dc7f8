#!/usr/bin/env bash
# The cpu-small LRA comparison behind docs/lra.md, one run at a time, resumable (rerun to continue;
# finished seeds are skipped). Usage: scripts/lra_cpu_small.sh [OUT]   (default runs/lra/cpu-small)
# Seeds 0, 1, 2 for every row (ListOps and the Text, Retrieval and Image proxies).
# One torch thread: on this 2-core machine shared with other jobs, two threads were up to 20×
# slower per step under load (thread oversubscription), one thread was not. Two of these
# scripts' rows may run at once (one per core), as docs/lra.md's were.
set -u
OUT=${1:-runs/lra/cpu-small}
PY=${PYTHON:-python}
run() {  # task attention positional seeds
  echo "$(date -u +%FT%TZ) start $*"
  $PY -m spe -q lra --task "$1" --attention "$2" --positional "$3" --seeds "$4" --preset cpu-small \
      --threads 1 --no-progress --out "$OUT/$1-$2-$3" || echo "FAILED $*"
  echo "$(date -u +%FT%TZ) end $*"
}
for attention in performer linear-relu; do
  for positional in ape sinespe convspe; do
    run listops "$attention" "$positional" 0,1,2
    run text "$attention" "$positional" 0,1,2
    run retrieval "$attention" "$positional" 0,1,2
  done
  for positional in ape-learned sinespe convspe-2d; do run image "$attention" "$positional" 0,1,2; done
done
run listops performer none 0,1,2   # control: no positional encoding
for attention in performer linear-relu; do   # controls: the Retrieval plateau without position
  run retrieval "$attention" none 0,1,2
done

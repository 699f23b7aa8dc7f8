#!/usr/bin/env bash
# The CUDA check behind docs/bench/h100.md and h200.md, sized to finish within 10 minutes:
# the CUDA tests (tests/test_cuda.py), the learned-time cost table (tools/analysis/learned_time_cost.py),
# PaTH beside softmax (tools/analysis/path_cost.py --device cuda), one short `spe bench` of single
# layers, then the rest of the suite in whatever time is left (TOTAL_S, default 570 s). Run from the
# repository root on a machine with a GPU and the device image's PyTorch; OUT (default runs/cuda)
# gets the logs and JSON. Extra wheels (music21, miditok, ...) may sit in .whl/ (installed first, no index).
set -uo pipefail
OUT=${OUT:-runs/cuda}
TOTAL_S=${TOTAL_S:-570}
mkdir -p "$OUT"
START=$SECONDS
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])" | tee -a "$OUT/gpu.txt"
step() {  # step NAME LIMIT_S COMMAND...: run with a limit, log to $OUT/NAME.log, note exit and time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - t0))s (limit ${limit}s)" | tee -a "$OUT/gpu.txt"
}
step cuda_tests "${CUDA_TESTS_TIMEOUT:-100}" python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda.py
tail -3 "$OUT/cuda_tests.log"
# the cost table's compiled learned-time rows compile in its untimed first rounds
step learned_time_cost "${COST_TIMEOUT:-210}" python3 tools/analysis/learned_time_cost.py
cat "$OUT/learned_time_cost.log"
step path_cost "${PATH_TIMEOUT:-90}" python3 tools/analysis/path_cost.py --device cuda
cat "$OUT/path_cost.log"
step bench "${BENCH_TIMEOUT:-120}" python3 -m spe bench --device cuda --modes train,generate --lengths 2048,16384 \
  --pairs ape+linear,sinespe+linear,ape+performer,sinespe+performer,none+softmax,path+softmax \
  --repeats 3 --budget-s 10 --out "$OUT/bench"
tail -4 "$OUT/bench.log"
LEFT=$((TOTAL_S - (SECONDS - START)))
if [ "$LEFT" -gt 30 ]; then
  step suite "$LEFT" python3 -m pytest -q -n 16 -p no:cacheprovider tests --ignore=tests/test_cuda.py
  tail -5 "$OUT/suite.log"
fi

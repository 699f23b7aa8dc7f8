#!/usr/bin/env bash
# The CUDA check behind docs/bench.md's "On CUDA" sections: the test suite on the GPU, then
# one `spe bench` of single layers and the learned-time model table. Run from the repository
# root on a machine with a GPU and the device image's PyTorch; OUT (default runs/cuda) gets the
# logs and JSON. Extra wheels (music21, miditok, ...) may sit in .whl/ (see docs/bench.md).
set -uo pipefail
OUT=${OUT:-runs/cuda}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])" | tee -a "$OUT/gpu.txt"
SECONDS=0
timeout "${SUITE_TIMEOUT:-200}" python3 -m pytest -q -n 16 -p no:cacheprovider tests > "$OUT/suite.log" 2>&1
echo "suite: exit $? in ${SECONDS}s" | tee -a "$OUT/gpu.txt"; tail -5 "$OUT/suite.log"
SECONDS=0
timeout 150 python3 -m spe bench --device cuda --modes train,generate --lengths 2048,16384 \
  --pairs ape+performer,sinespe+performer,convspe+performer,convspe:direct+performer,none+softmax,path+softmax \
  --decay none,gated --repeats 5 --budget-s 20 --no-progress --out /tmp/cuda-bench > "$OUT/bench.log" 2>&1
echo "bench: exit $? in ${SECONDS}s" | tee -a "$OUT/gpu.txt"; tail -3 "$OUT/bench.log"
cp /tmp/cuda-bench/bench.json "$OUT/bench.json" 2>/dev/null; cat /tmp/cuda-bench/*.md > "$OUT/bench.md" 2>/dev/null
SECONDS=0
timeout 60 python3 tools/analysis/learned_time_cost.py > "$OUT/learned_time_cost.jsonl" 2>&1
echo "learned-time cost: exit $? in ${SECONDS}s" | tee -a "$OUT/gpu.txt"; cat "$OUT/learned_time_cost.jsonl"

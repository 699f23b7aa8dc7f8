#!/usr/bin/env bash
# The CUDA check behind docs/bench.md's "On CUDA" sections: one `spe bench` of single layers
# (the linear kernels with and without the gate; softmax through FlexAttention and through the
# per-block form), the layer profile with torch.compile against eager, then the test suite on the
# GPU. Run from the repository root on a machine with a GPU and the device image's PyTorch; OUT
# (default runs/cuda) gets the logs and JSON. Extra wheels (music21, miditok, ...) may sit in
# .whl/ (see docs/bench.md).
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
timeout "${BENCH_TIMEOUT:-240}" python3 -m spe bench --device cuda --modes train --lengths 2048,16384 \
  --pairs ape+performer,sinespe+performer,convspe+performer,convspe:materialized+performer,none+softmax \
  --decay none,gated --softmax-impl blocks,flex --repeats 3 --budget-s 10 --no-progress --out "$OUT/bench" \
  > "$OUT/bench.log" 2>&1
echo "bench: exit $? in ${SECONDS}s" | tee -a "$OUT/gpu.txt"; tail -3 "$OUT/bench.log"
SECONDS=0
timeout "${PROFILE_TIMEOUT:-120}" python3 tools/analysis/layer_profile.py --device cuda --length 16384 \
  --pairs ape+performer,sinespe+performer --repeats 3 > "$OUT/layer_profile.txt" 2>&1
echo "profile: exit $? in ${SECONDS}s" | tee -a "$OUT/gpu.txt"; grep '^{' "$OUT/layer_profile.txt"
SECONDS=0
timeout "${SUITE_TIMEOUT:-230}" python3 -m pytest -q -n 16 -p no:cacheprovider tests > "$OUT/suite.log" 2>&1
echo "suite: exit $? in ${SECONDS}s" | tee -a "$OUT/gpu.txt"; tail -5 "$OUT/suite.log"

#!/usr/bin/env bash
# The experiment behind docs/results.md: train APE, sineSPE (gated, ungated),
# convSPE (gated, ungated) and RoPE, plus sineSPE with R = 8 and 64 for the R grid, on the
# Bach chorales (or on DATA: a MIDI folder or music21:NAME), all with the main job's model
# and 500 steps; then `spe report` over them and a copy of the report into docs/.
#   bash scripts/recipe.sh                         # Bach, writes docs/results.md
#   DATA=music21:palestrina/4 DOC=docs/results-palestrina.md bash scripts/recipe.sh
# Finished runs are reused (spe sweep skips them), so the script can be stopped and restarted.
# About 45 minutes of training on 2 CPU cores, then about 10 minutes for the report.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .venv ] || python3 -m venv .venv
source .venv/bin/activate
python -m pip install --quiet torch==2.13.0 -e ".[music]"

OUT=${OUT:-runs}
DOC=${DOC:-docs/results.md}
DATA_FLAG=()
[ -n "${DATA:-}" ] && DATA_FLAG=(--data "$DATA")
VARIANTS=(ape sinespe sinespe-ungated convspe convspe-ungated rope sinespe-R8 sinespe-R64)

spe sweep --plan ablation --out "$OUT/ablation" --seeds 0 --only "$(IFS=,; echo "${VARIANTS[*]}")" "${DATA_FLAG[@]}"
CHECKPOINTS=()
for v in "${VARIANTS[@]}"; do CHECKPOINTS+=(--checkpoint "$OUT/ablation/$v/seed0"); done
spe report "${CHECKPOINTS[@]}" --r-test 8,32,64,128 --max-length 768 --out "$OUT/report" "${DATA_FLAG[@]}"
python - "$OUT/report" "$DOC" <<'PY'
import sys
from pathlib import Path

from spe.lab.music.evaluation.publish import publish_report

# docs/results.md keeps its hand-written intro (how it was produced, the paper's Table 6 beside ours)
intro = Path("tools/docs/results_intro.md")
if Path(sys.argv[2]).resolve() == Path("docs/results.md").resolve():
    preamble = intro.read_text(encoding="utf-8") + "\n"
else:
    preamble = ("<!-- produced by scripts/recipe.sh: spe sweep --plan ablation (seed 0) + spe report; "
                "do not edit by hand -->\n\n")
print("wrote", publish_report(sys.argv[1], sys.argv[2], preamble=preamble))
PY

#!/usr/bin/env bash
# The main job: install spe with its music extra into ./.venv, then train sineSPE and APE
# models on the Bach chorales of music21, evaluate them beyond the training length, and
# generate a piece. Extra arguments go to `spe demo` (e.g. --steps 300).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# torch==2.13.0 is this machine kind's local CPU wheel; GPU installs: docs/usage.md.
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0" -e ".[music]"
exec .venv/bin/spe demo --out runs/demo "$@"

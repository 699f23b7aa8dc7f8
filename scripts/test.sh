#!/usr/bin/env bash
# Install spe with its test extra into ./.venv and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0" -e ".[test]"
exec .venv/bin/python -m pytest -q "$@"

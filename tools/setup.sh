#!/usr/bin/env bash
# Create .venv with the tested, CPU-only stack, the documentation tools and fastxtend_accel installed in editable mode.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install -q --disable-pip-version-check -c .ci/constraints.txt -e ".[dev,docs]"

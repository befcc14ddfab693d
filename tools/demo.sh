#!/usr/bin/env bash
# Set up, then train on scikit-learn's digits with 2 CPU processes in bf16 (examples/train.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python -m torch.distributed.run --nproc_per_node 2 examples/train.py --mixed-precision bf16 "$@"

#!/usr/bin/env bash
# XLA check: `pytest -m xla` (tests/test_xla.py) on XLA's CPU runtime (PJRT_DEVICE=CPU), in a venv of its own.
#
#   bash tools/xla_check.sh                        # builds the venv the first time (~3.5 min, 7.8 GB), then reuses it
#   bash tools/xla_check.sh --bench                # the benchmark (bench/bench_xla.py) too, before the tests
#   bash tools/xla_check.sh -k bf16 --junitxml=F   # other arguments go to pytest
#
# torch_xla never goes into .venv: Accelerate sets up XLA whenever torch_xla imports, even with `cpu=True`. This venv lives
# outside the tree, in $XLA_VENV (default ~/.cache/fastxtend_accel/venv-xla), built with $XLA_PYTHON (default python3) and
# the pins of .ci/constraints-xla.txt by tools/cached_venv.sh. Ends with pytest's summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${XLA_VENV:-$HOME/.cache/fastxtend_accel/venv-xla}
PY=${XLA_PYTHON:-python3}
BENCH=0
if [ "${1:-}" = "--bench" ]; then BENCH=1; shift; fi

source tools/cached_venv.sh
start=$SECONDS
cached_venv "$VENV" "$PY" .ci/constraints-xla.txt \
  torch torch_xla torchvision fastai fastcore accelerate google-crc32c scikit-learn pytest
export PJRT_DEVICE=CPU PYTHONWARNINGS=ignore
"$VENV/bin/python" -c "import torch, torch_xla, fastai, accelerate, fastxtend_accel
print(f'torch {torch.__version__}, torch_xla {torch_xla.__version__}, fastai {fastai.__version__}, '
      f'accelerate {accelerate.__version__}, fastxtend_accel from {fastxtend_accel.__path__[0]}')"
echo "xla_check: ready in $((SECONDS-start)) s"
status=0
if [ "$BENCH" = 1 ]; then "$VENV/bin/python" bench/bench_xla.py || status=$?; fi
"$VENV/bin/python" -m pytest -m xla -p no:cacheprovider -q -rfEs tests/test_xla.py "$@" || status=$?
exit $status

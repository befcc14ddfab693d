#!/usr/bin/env bash
# The version matrix: the lowest and the newest supported releases, each cell in a venv of its own outside the tree.
#
#   bash tools/matrix.sh                      # every cell: build (the first time, ~3 min and 7 GB each) or reuse, then run
#   bash tools/matrix.sh --build              # only build or reuse the venvs (tools/test.sh does this early, in the background)
#   bash tools/matrix.sh --junitxml-dir DIR   # JUnit reports in DIR: matrix-CELL-lessons.xml and matrix-CELL.xml
#
# A cell is a file .ci/matrix-CELL.txt: pip constraints for the packages pyproject.toml depends on, and a line `# python: X.Y`.
# Its venv, $MATRIX_VENVS/CELL (default ~/.cache/fastxtend_accel/matrix), is built with `pythonX.Y` from PATH or pyenv's
# (this machine image has pyenv's 3.10 and 3.12; Debian 12 packages 3.11 only). A cell whose Python is missing is reported
# skipped. Each cell runs the lessons of the patching, loop, accelerator, callback, core, compiler and checkpoint notebooks
# (tools/lessons.py: nbdev picks the cells in .venv, as plain `nbdev-test` would), then the tests marked `matrix`: the
# 2-process launches (DDP against 1 process, FSDP2, a checkpoint resumed), started by torchrun and `accelerate launch`.
# The `multiproc` lessons are left out: they fork the notebook's process (`debug_launcher`), and with torch 2.13's CUDA
# build on Python 3.12 a fork after a compiled backward can't run autograd ("Unable to handle autograd's threading in
# combination with fork-based multiprocessing"), a limit of torch's that launchers which start fresh processes don't meet.
set -euo pipefail
cd "$(dirname "$0")/.."
VENVS=${MATRIX_VENVS:-$HOME/.cache/fastxtend_accel/matrix}
NBS=(nbs/01_patching.ipynb nbs/05a_loop.ipynb nbs/07_accelerator.ipynb nbs/08_callback.ipynb nbs/08c_core.ipynb
     nbs/09a_compiler.ipynb nbs/16_checkpoint.ipynb)
TESTS=(tests/test_core.py tests/test_fsdp.py tests/test_checkpoint.py) # their tests marked `matrix` (tests/conftest.py)
BUILD_ONLY=0 REPORTS=""
case "${1:-}" in
  --build) BUILD_ONLY=1 ;;
  --junitxml-dir) REPORTS=$2 ;;
esac
source tools/cached_venv.sh

find_python() { # X.Y -> a python of that version that runs (pyenv's shims are on PATH even where they refuse), or nothing
  local c
  for c in "$(command -v "python$1" || true)" \
           $(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")/versions/$1".*/bin/python 2>/dev/null | sort -rV); do
    [ -n "$c" ] && "$c" -c 'import sys, venv' >/dev/null 2>&1 && { echo "$c"; return; }
  done
}

status=0 summary=""
for cons in .ci/matrix-*.txt; do
  cell=$(basename "$cons" .txt); cell=${cell#matrix-}
  want=$(sed -n 's/^# python: *//p' "$cons")
  py=$(find_python "$want" || true)
  if [ -z "$py" ]; then
    echo "matrix $cell: no Python $want here (PATH, pyenv): skipped"
    summary+="matrix $cell: skipped, no Python $want"$'\n'
    [ -n "$REPORTS" ] && printf '<testsuite name="matrix-%s" tests="1" skipped="1"><testcase classname="matrix" name="%s">
<skipped message="no Python %s"/></testcase></testsuite>\n' "$cell" "$cell" "$want" > "$REPORTS/matrix-$cell.xml"
    continue
  fi
  cached_venv "$VENVS/$cell" "$py" "$cons" torch torchvision fastai fastcore accelerate google-crc32c psutil pytest
  [ "$BUILD_ONLY" = 1 ] && continue
  v="$VENVS/$cell/bin/python"
  stack=$("$v" -c "import sys, torch, fastai, fastcore, accelerate
print(f'Python {sys.version.split()[0]}, torch {torch.__version__}, fastai {fastai.__version__}, fastcore {fastcore.__version__}, accelerate {accelerate.__version__}')")
  echo "matrix $cell: $stack"
  picked=$(mktemp -d)
  .venv/bin/python tools/lessons.py pick "$picked" "${NBS[@]}"
  start=$SECONDS cell_status=0
  "$v" tools/lessons.py run "$picked" ${REPORTS:+--junitxml="$REPORTS/matrix-$cell-lessons.xml"} || cell_status=1
  rm -rf "$picked"
  "$v" -m pytest -m matrix -p no:cacheprovider -q -rfE -o junit_suite_name="matrix-$cell" \
    ${REPORTS:+--junitxml="$REPORTS/matrix-$cell.xml"} "${TESTS[@]}" || cell_status=1
  summary+="matrix $cell ($stack): $([ $cell_status = 0 ] && echo passed || echo FAILED) in $((SECONDS-start)) s"$'\n'
  [ $cell_status = 0 ] || status=1
done
printf '%s' "$summary"
exit $status

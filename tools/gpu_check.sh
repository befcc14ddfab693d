#!/usr/bin/env bash
# GPU proof (issue 14): install the project over the machine's CUDA torch, then run the GPU tests, every `#| cuda` lesson,
# the fastai.vision check and the GPU benchmarks, and write a short results file.
#
#   bash tools/gpu_check.sh [RESULTS.md]     # default: $OUT/gpu_results.md where $OUT is set, else bench/results/gpu_results.md
#   bash tools/gpu_check.sh --download-wheels   # on a machine with internet: fill $GPU_CHECK_WHEELS (below)
#
# Installing. The CUDA torch is the machine's own (a CUDA wheel is GBs: too big to carry). A machine without internet
# gets the pure-Python packages it lacks (fastai, fastcore, nbdev, execnb, IPython, ...: `--download-wheels` fetches them,
# at the versions of the local .venv) as wheels in $GPU_CHECK_WHEELS (default `wheels/`; keep it out of git). They are
# installed with --no-index --no-deps into a private folder that goes first on PYTHONPATH, with the repository itself.
# They are fetched for Python $GPU_CHECK_PYVER (default 3.12, the CUDA machines' python3).
# Without wheels, what is installed is used. The interpreter: $PYTHON, else .venv/bin/python if it imports fastai, else python3.
#
# Stages, in this order: tests, lessons, vision, bench; $GPU_CHECK_STAGES picks some (e.g. "vision bench"), to split a
# run over calls of limited length. The results file is rewritten after each stage, each stage's log is kept beside it.
# The lessons stage runs the notebooks that hold a `#| cuda` cell, with --flags cuda (all of them where
# GPU_CHECK_ALL_LESSONS=1): the `#| multiproc` lessons fork CPU processes, which CUDA forbids once the notebook used it,
# and run in CI.
#
# Without CUDA: runs the CPU parts (the GPU tests are collected and skip with their reason; the benchmark runs its smoke
# mode), says which CUDA stages were skipped and why, and exits 0 if those parts pass. With CUDA: exits 1 if a stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
WHEELS=${GPU_CHECK_WHEELS:-wheels}
# the pure-Python distributions a bare CUDA image lacks (it has torch, torchvision, accelerate, numpy, pandas, scikit-learn,
# matplotlib, pillow, pytest, rich, anyio, pyyaml, ...): fastai's stack, and nbdev-test's (execnb runs notebooks in IPython)
DISTS="fastai fastcore fastprogress fastdownload fasttransform plum-dispatch beartype python-fasthtml starlette python-multipart
itsdangerous google-crc32c nbdev execnb asttokens astunparse ipython ipython-pygments-lexers traitlets matplotlib-inline stack-data executing pure-eval"

if [ "${1:-}" = "--download-wheels" ]; then
  PY=${PYTHON:-.venv/bin/python}
  mkdir -p "$WHEELS"
  for d in $DISTS; do
    v=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$d") || { echo "$d is not installed in $PY" >&2; exit 1; }
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version "${GPU_CHECK_PYVER:-3.12}" -d "$WHEELS" "$d==$v" || exit 1
  done
  echo "$(ls "$WHEELS"/*.whl | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1), in $WHEELS"
  exit 0
fi

if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ] && .venv/bin/python -c "import fastai" 2>/dev/null; then PY=.venv/bin/python
else PY=python3; fi
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  SITE=${TMPDIR:-/tmp}/gpu_check_site
  rm -rf "$SITE"
  echo "installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE"
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
if ! "$PY" -c "import torch, fastai.basics, accelerate, nbdev.test, execnb.shell, pytest, fastxtend_accel.all"; then
  echo "gpu_check: the stack does not import with $PY (above). Carry the wheels: see the top of this script." >&2
  exit 1
fi

if [ -n "${1:-}" ]; then RESULTS=$1
elif [ -n "${OUT:-}" ]; then RESULTS=$OUT/gpu_results.md
else RESULTS=bench/results/gpu_results.md; fi
mkdir -p "$(dirname "$RESULTS")"
LOGS=$(dirname "$RESULTS")
CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))")
if [ "$CUDA" = 1 ]; then NO_CUDA=
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  NO_CUDA="torch $("$PY" -c 'import torch; print(torch.__version__)') does not see the GPU that nvidia-smi lists (a CPU build of torch?)"
else NO_CUDA="no CUDA GPU on this machine"; fi

ENV=$("$PY" - <<'EOF'
import platform, torch, fastai, fastcore, accelerate, fastxtend_accel
gpu = (f"{torch.cuda.get_device_name()} (capability {'.'.join(map(str, torch.cuda.get_device_capability()))}), CUDA {torch.version.cuda}"
       if torch.cuda.is_available() else "none")
print(f"- GPU: {gpu}\n- Python {platform.python_version()}, torch {torch.__version__}, fastai {fastai.__version__}, "
      f"fastcore {fastcore.__version__}, accelerate {accelerate.__version__}, fastxtend_accel {fastxtend_accel.__version__}")
EOF
)
if COMMIT=$(git rev-parse --short HEAD 2>/dev/null); then git diff --quiet HEAD || COMMIT="$COMMIT, with uncommitted changes"
else COMMIT="unknown (no git here)"; fi
SECTIONS=$(mktemp)
NBDEV_TEST=$(mktemp --suffix .py) # nbdev-test's entry point, for the interpreter chosen above whatever its bin folder
printf 'from nbdev.test import nbdev_test\nnbdev_test()\n' > "$NBDEV_TEST"
trap 'rm -f "$SECTIONS" "$NBDEV_TEST"' EXIT
FAILED=""
write_results() {
  { echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"; echo
    echo "$ENV"; echo "- commit: $COMMIT"
    if [ -n "$NO_CUDA" ]; then echo "- CUDA stages skipped: $NO_CUDA"; fi
    cat "$SECTIONS"; } > "$RESULTS"
}

# run_stage NAME SUMMARY_FILTER COMMAND...: run COMMAND, log to $LOGS/gpu_NAME.log, add its summary lines to the results
run_stage() {
  local name=$1 filter=$2; shift 2
  local log=$LOGS/gpu_$name.log start=$SECONDS status
  echo; echo "=== $name: $*"
  "$@" 2>&1 | tee "$log"
  if [ "${PIPESTATUS[0]}" = 0 ]; then status=passed; else status=FAILED; FAILED="$FAILED $name"; fi
  { echo; echo "## $name: $status ($((SECONDS-start)) s)"; echo "\`$*\` (log: $(basename "$log"))"; echo
    echo '```'; grep -E "$filter" "$log" | tail -40; echo '```'; } >> "$SECTIONS"
  write_results
}

skip_stage() { # skip_stage NAME REASON
  echo; echo "=== $1: SKIPPED: $2"
  { echo; echo "## $1: skipped"; echo "$2"; } >> "$SECTIONS"
  write_results
}

nbdev_test() { "$PY" "$NBDEV_TEST" "$@"; }

write_results
for stage in ${GPU_CHECK_STAGES:-tests lessons vision bench}; do
  case $stage in
  tests)
    if [ -z "$NO_CUDA" ]; then run_stage tests '^(FAILED|ERROR|SKIPPED|PASSED)|passed|failed|error' "$PY" -m pytest -m gpu -rA -q -p no:cacheprovider tests/test_gpu.py
    else run_stage tests '^SKIPPED|passed|skipped|failed|error' "$PY" -m pytest -m gpu -rs -q -p no:cacheprovider tests/test_gpu.py; fi ;;
  lessons)
    if [ -n "$NO_CUDA" ]; then skip_stage lessons "the \`#| cuda\` lessons need CUDA ($NO_CUDA); the other lessons run in CI: \`bash tools/test.sh\`"
    elif [ "${GPU_CHECK_ALL_LESSONS:-0}" = 1 ]; then run_stage lessons '' nbdev_test --flags cuda --timing
    else
      nbs=$(grep -l '"#| cuda' nbs/*.ipynb | xargs -n1 basename | sed 's/\.ipynb$//' | paste -sd'|')
      run_stage lessons '' nbdev_test --flags cuda --timing --file-re "^($nbs)\.ipynb\$"
    fi ;;
  vision)
    if [ -n "$NO_CUDA" ]; then skip_stage vision "needs CUDA ($NO_CUDA): it checks \`notebook_launcher\` and forked processes against CUDA's initialisation (and fastai.vision does not import with a CPU-only torchvision build)"
    else run_stage vision '^  |vision check' "$PY" tests/scripts/vision_check.py; fi ;;
  bench)
    if [ -n "$NO_CUDA" ]; then
      run_stage bench '^\||^target|^ResNet' "$PY" bench/bench_gpu.py --device cpu --tiny
      skip_stage 'bench on the GPU' "needs CUDA ($NO_CUDA); above is the smoke run, whose timings mean nothing"
    else
      run_stage bench '^\||^target|^ResNet|^GPU busy' "$PY" bench/bench_gpu.py
      run_stage bench_loop '^\||^target|^MLP|TfmdDL' "$PY" bench/bench_loop.py --device cuda
    fi ;;
  *) echo "unknown stage $stage: use tests, lessons, vision, bench" >&2; exit 2 ;;
  esac
done

echo; echo "=== results ($RESULTS)"; cat "$RESULTS"
if [ -n "$FAILED" ]; then echo "gpu_check: FAILED:$FAILED" >&2; exit 1; fi
echo "gpu_check: $([ -n "$NO_CUDA" ] && echo "CPU parts passed; CUDA stages skipped ($NO_CUDA)" || echo "all stages passed")"

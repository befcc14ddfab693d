#!/usr/bin/env bash
# Set up, check the exported modules match the notebooks, run the notebooks' lessons, then pytest, then the XLA tests
# (tools/xla_check.sh), then the version matrix (tools/matrix.sh); fail if anything was left in the tree.
# bf16 on CPU runs on kernels that depend on the instruction set (native bf16 with avx512_bf16/AMX, emulated with AVX-512, no bf16
# LSTM with AVX2 alone): the bf16 lessons and tests run once as this CPU is and once as on an AVX2 CPU, whose kernels oneDNN,
# torch's own vectorized code and MKL pick when told the CPU has no more than AVX2.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# the version matrix's venvs build (or are found) while the notebooks and tests below run: pip mostly waits on the network
matrix_log=$(mktemp)
bash tools/matrix.sh --build > "$matrix_log" 2>&1 &
matrix_build=$!
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'); bf16 instructions: $(grep -o -w 'avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | xargs || true)"

state() { { git diff; git status --porcelain --untracked-files=all; } | sha1sum; }
before=$(state)
.venv/bin/nbdev-export
.venv/bin/nbdev-clean
if [ "$before" != "$(state)" ]; then
  echo "nbdev-export/nbdev-clean changed the tree: export and clean the notebooks, then commit." >&2
  git status --porcelain >&2
  exit 1
fi
echo "notebooks and modules in sync"
.venv/bin/python tools/docs.py readme --check
# the documentation site: nbdev's processor on every notebook (what `nbdev-docs` runs before Quarto), then Sphinx;
# tests/test_docs.py opens every page in Debian's Chromium, installed here when missing
command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || echo "chromium not installed"
bash tools/docs.sh
# tests/test_slurm.py starts a one-node SLURM cluster (Debian's slurm-wlm and munge), installed here when missing
command -v slurmctld >/dev/null && command -v munged >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null ||
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; } || echo "slurm-wlm not installed"

# inductor's on-disk cache doesn't tell the two apart: kernels compiled for this CPU, reused as if for AVX2, gave NaN
avx2_cache=$(mktemp -d)
trap 'rm -rf "$avx2_cache"' EXIT
avx2() { ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 TORCHINDUCTOR_CACHE_DIR=$avx2_cache "$@"; }
.venv/bin/nbdev-test --flags multiproc
for nb in $(grep -l "mixed_precision='bf16'" nbs/*.ipynb); do
  echo -n "$nb as on an AVX2 CPU: "; avx2 .venv/bin/nbdev-test --flags multiproc "$nb"
done

reports=$(mktemp -d)
trap 'rm -rf "$reports" "$avx2_cache"' EXIT
pytest() { .venv/bin/python -m pytest -q -p no:cacheprovider "$@"; }
status=0
pytest --junitxml="$reports/as-is.xml" tests || status=$?
echo "bf16 tests as on an AVX2 CPU (ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2):"
avx2 pytest -m bf16 --junitxml="$reports/avx2.xml" tests || status=$?
echo "XLA tests on XLA's CPU runtime (tools/xla_check.sh: torch_xla in a venv of its own, outside the tree):"
bash tools/xla_check.sh --junitxml="$reports/xla.xml" || status=$?
echo "The version matrix (tools/matrix.sh: the lowest and the newest supported releases, each in a venv of its own):"
wait $matrix_build || { cat "$matrix_log"; echo "the version matrix's venvs did not build" >&2; status=1; }
cat "$matrix_log"; rm -f "$matrix_log"
bash tools/matrix.sh --junitxml-dir "$reports" || status=$?
if [ "$before" != "$(state)" ]; then
  echo "the tests left files in the working tree (they must write to temporary folders):" >&2
  git status --porcelain --untracked-files=all >&2
  exit 1
fi
.venv/bin/python - "$reports"/*.xml <<'EOF'
import sys, xml.etree.ElementTree as ET
n = dict(tests=0, failures=0, errors=0, skipped=0)
for f in sys.argv[1:]:
    for s in ET.parse(f).getroot().iter('testsuite'):
        for k in n: n[k] += int(s.get(k, 0))
print(f"all: {n['tests']-n['failures']-n['errors']-n['skipped']} passed, {n['failures']+n['errors']} failed, {n['skipped']} skipped")
EOF
exit $status

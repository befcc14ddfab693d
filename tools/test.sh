#!/usr/bin/env bash
# Set up, check the exported modules match the notebooks, run the notebooks' lessons, then pytest; fail if anything was left in the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

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

.venv/bin/nbdev-test --flags multiproc
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider tests || status=$?
if [ "$before" != "$(state)" ]; then
  echo "the tests left files in the working tree (they must write to temporary folders):" >&2
  git status --porcelain --untracked-files=all >&2
  exit 1
fi
exit $status

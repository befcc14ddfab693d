#!/usr/bin/env bash
# Build the documentation site into _docs/ from the notebooks, without Quarto: nbdev's processor (`_proc/`, the same
# step `nbdev-docs` runs before Quarto), then Sphinx + myst-nb + Furo. Sets up the venv first (tools/setup.sh), as
# the README's other commands do, so that it works on a fresh clone.
# `bash tools/docs.sh --test` also opens every page in headless Chromium (tests/test_docs.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
py=.venv/bin/python
$py tools/docs.py imports
$py -W ignore::UserWarning -c "from nbdev.serve import proc_nbs; proc_nbs(force=True)"
$py tools/docs.py stage >/dev/null
rm -rf _build/html _docs
# into _build/html, then moved: myst-nb writes a folder beside Sphinx's output folder
$py -m sphinx -q -W --keep-going -b html -c docs -d _build/doctrees _build/docs _build/html
mv _build/html _docs
echo "site built: _docs/index.html"
if [ "${1:-}" = "--test" ]; then
  command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
  $py -m pytest -q -p no:cacheprovider tests/test_docs.py
fi

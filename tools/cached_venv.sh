# Sourced by tools/xla_check.sh and tools/matrix.sh: venvs outside the tree, built once and reused.
#
#   cached_venv VENV PYTHON CONSTRAINTS PACKAGE...
#
# builds VENV with PYTHON and pip's `-c CONSTRAINTS`, unless it was built from the same Python version and pins (rebuilt
# when either changes); then, new or reused, it installs this checkout into it (editable, without dependencies) when it is
# not the one installed.
# pip's output goes to VENV.build.log, whose end is printed if pip fails.
cached_venv() {
  local venv=$1 py=$2 cons=$3 repo stamp log installed start=$SECONDS; shift 3
  repo=$(pwd)
  stamp="$("$py" -c 'import sys; print(sys.version.split()[0])')
$(grep -v '^ *#' "$cons" | sed '/^ *$/d')"
  mkdir -p "$(dirname "$venv")"
  log=$venv.build.log
  _pip() { "$venv/bin/python" -m pip install --disable-pip-version-check "$@" >> "$log" 2>&1 || { tail -30 "$log"; return 1; }; }
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.pins" 2>/dev/null)" != "$stamp" ]; then
    echo "building $venv (log: $log)"
    rm -rf "$venv"
    : > "$log"
    "$py" -m venv "$venv"
    _pip --upgrade pip
    _pip -c "$cons" "$@"
    printf '%s\n' "$stamp" > "$venv/.pins"
    echo "built $venv in $((SECONDS-start)) s, $(du -sh "$venv" | cut -f1)"
  else
    echo "reusing $venv"
  fi
  installed=$(cd / && "$venv/bin/python" -c 'import fastxtend_accel as m, os; print(os.path.dirname(os.path.dirname(m.__file__)))' \
              2>/dev/null || true)
  if [ "$installed" != "$repo" ]; then
    echo "installing this checkout into $venv (was: ${installed:-none})"
    _pip --no-deps -e "$repo"
  fi
}

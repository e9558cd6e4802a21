# Sourced by the scripts: create .venv and (re)install credgate into it whenever pyproject.toml changed.
# $1: the extras to install ("" or "[dev]").
extras="${1:-}"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "credgate needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "first run: creating .venv (Python's virtual environment) …" >&2
  "$python" -m venv .venv
fi
# Reinstalled when pyproject.toml changed, or when these extras were not installed ("[dev]" holds everything "").
hash="$("$python" -c 'import hashlib,sys; print(hashlib.sha256(open("pyproject.toml","rb").read()).hexdigest())')"
read -r installed_hash installed_extras 2>/dev/null < .venv/.install-stamp || true
if [ "${installed_hash:-}" != "$hash" ] || { [ -n "$extras" ] && [ "${installed_extras:-}" != "$extras" ]; }; then
  what="credgate and its dependencies"
  [ -n "$extras" ] && what="credgate, its dependencies and the test tools ($extras: every provider's SDK, Playwright …)"
  echo "installing $what into .venv: about a minute the first time, seconds after …" >&2
  started=$SECONDS
  .venv/bin/python -m pip install --quiet --upgrade pip >&2
  .venv/bin/python -m pip install --quiet -e ".$extras" >&2
  echo "$hash ${extras:-[]}" > .venv/.install-stamp
  echo "installed in $((SECONDS - started)) s" >&2
fi

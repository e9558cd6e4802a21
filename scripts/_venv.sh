# Sourced by the scripts: create .venv and (re)install credgate into it whenever pyproject.toml changed.
# $1: the extras to install ("" or "[dev]").
extras="${1:-}"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "credgate needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp="$(cat pyproject.toml | "$python" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')$extras"
if [ "$(cat .venv/.install-stamp 2>/dev/null)" != "$stamp" ]; then
  echo "installing credgate$extras into .venv …" >&2
  .venv/bin/python -m pip install --quiet --upgrade pip >&2
  .venv/bin/python -m pip install --quiet -e ".$extras" >&2
  echo "$stamp" > .venv/.install-stamp
fi

# Sourced by the scripts: create .venv and (re)install credgate into it whenever pyproject.toml or its lock changed.
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
# Every package comes from a lock at the version tested, and must match one of its recorded hashes: a release
# published with stolen credentials cannot slip in (scripts/lock resolves them again).
lock=requirements/serve.lock
[ -n "$extras" ] && lock=requirements/test.lock
# Reinstalled when pyproject.toml or a lock changed, or when these extras were not installed ("[dev]" holds
# everything "" does, at the same versions).
hash="$(cat pyproject.toml requirements/*.lock | "$python" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
read -r installed_hash installed_extras 2>/dev/null < .venv/.install-stamp || true
if [ "${installed_hash:-}" != "$hash" ] || { [ -n "$extras" ] && [ "${installed_extras:-}" != "$extras" ]; }; then
  what="credgate and its dependencies"
  [ -n "$extras" ] && what="credgate, its dependencies and the test tools ($extras: every provider's SDK, Playwright …)"
  echo "installing $what into .venv from $lock: about a minute the first time, seconds after …" >&2
  started=$SECONDS
  # Wheels only: a package built from source here would fetch its build dependencies unhashed, from no lock.
  if ! .venv/bin/python -m pip install --quiet --require-hashes --only-binary :all: -r "$lock" >&2; then
    echo "could not install $lock (a package with no wheel for this platform is not built from source: see" \
      "docs/deploy.md, systemd)" >&2
    exit 1
  fi
  # credgate itself, built by the locked setuptools; `pip check` fails if pyproject.toml's own dependencies ask
  # for what the lock does not hold (run scripts/lock); an extra's are the test suite's to check.
  .venv/bin/python -m pip install --quiet --no-deps --no-build-isolation -e . >&2
  if ! problems="$(.venv/bin/python -m pip check)"; then
    echo "$problems (run scripts/lock to lock what pyproject.toml asks for)" >&2
    exit 1
  fi
  echo "$hash ${extras:-[]}" > .venv/.install-stamp
  echo "installed in $((SECONDS - started)) s" >&2
fi

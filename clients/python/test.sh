#!/usr/bin/env bash
# Runs the Python SDK's tests against the real server binary.
#
#   clients/python/test.sh [pytest args...]
#
# FASTACK_BIN: the server binary (default: <repo>/target/debug/fastack);
# a missing binary fails the run. PYTHON: the interpreter for the virtualenv
# (default python3); FASTACK_PY_VENV: its directory (default .venv here).
# Creates the virtualenv if needed, installs the package (a regular install,
# as a user would) and requirements-test.txt, type-checks, runs pytest.
set -euo pipefail
cd "$(dirname "$0")"
here=$(pwd)
repo=$(cd ../.. && pwd)
export FASTACK_BIN=${FASTACK_BIN:-$repo/target/debug/fastack}
venv=${FASTACK_PY_VENV:-.venv}
case $venv in /*) ;; *) venv=$here/$venv ;; esac
python=${PYTHON:-python3}

if [ ! -x "$FASTACK_BIN" ]; then
  echo "FAIL: the fastack server binary is missing: $FASTACK_BIN" >&2
  echo "      build it (cargo build) or set FASTACK_BIN; these tests run against the real server." >&2
  exit 1
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv ($("$python" --version 2>&1))"
  "$python" -m venv "$venv"
fi
py="$venv/bin/python"
pipq() { "$py" -m pip install --quiet --disable-pip-version-check "$@"; }

echo "== installing the package and the test requirements"
pipq -r requirements-test.txt
pipq --force-reinstall --no-deps . && pipq .
rm -rf build fastack.egg-info   # setuptools' leftovers of the build above

# The installed package (not the source tree) has the generated layer and py.typed.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
(cd "$scratch" && "$py" - <<'PY'
import importlib.resources as r, fastack, fastack._generated, fastack.webhooks, fastack.amqp
from fastack import ApiError, Client, Tracker, AsyncClient
assert "site-packages" in fastack.__file__, fastack.__file__
assert (r.files("fastack") / "py.typed").is_file(), "py.typed is not installed"
print("installed:", fastack.__version__, fastack.__file__)
PY
)

if "$py" -c 'import mypy' 2>/dev/null; then
  echo "== mypy --strict"
  "$py" -m mypy
fi

echo "== pytest (server: $FASTACK_BIN)"
# Sequential on purpose: every test starts its own server; the machine is small.
"$py" -m pytest "$@"

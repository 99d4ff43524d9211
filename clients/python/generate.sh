#!/usr/bin/env bash
# Regenerates fastack/_generated/ from openapi/openapi.json with the pinned
# openapi-python-client (requirements-dev.txt), the custom templates in
# generator/templates/ (Python 3.9+ output) and the config
# openapi-python-client.yaml. Idempotent: a second run changes nothing, and
# the output holds no timestamps or absolute paths.
#
# Usage: clients/python/generate.sh        (PYTHON=python3.12 to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")"
here=$(pwd)
spec=../../openapi/openapi.json
venv=${FASTACK_PY_VENV:-.venv}
case $venv in /*) ;; *) venv=$here/$venv ;; esac
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "generate.sh: openapi-python-client 0.29.1 needs Python >= 3.11 ($python is older); set PYTHON" >&2
    exit 1
  }
  "$python" -m venv "$venv"
fi
want=$(sed -n 's/^openapi-python-client==//p' requirements-dev.txt)
have=$("$venv/bin/python" -c 'from importlib.metadata import version as v; print(v("openapi-python-client"), v("ruff"))' 2>/dev/null || true)
if [ "$have" != "$want $(sed -n 's/^ruff==//p' requirements-dev.txt)" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
fi

# The post-hooks call `ruff`: the pinned one, with this directory's settings.
export PATH="$venv/bin:$PATH"
out=fastack/_generated
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! openapi-python-client generate \
      --path "$spec" \
      --meta none \
      --config openapi-python-client.yaml \
      --custom-template-path generator/templates \
      --output-path "$out" \
      --overwrite >"$log" 2>&1; then
  cat "$log" >&2
  echo "generate.sh: openapi-python-client failed" >&2
  exit 1
fi
# Known warnings of the current document (reported upstream, see
# generator/README.md); any other warning is shown in full.
grep -E '^(WARNING|Unable|Cannot|Failure|Generating|Warning)' "$log" | sed 's/ object at 0x[0-9a-f]*//' | sort | uniq -c || true
echo "generated $out from $spec"

#!/usr/bin/env bash
# Contract test: fuzzes a running `fastack serve` (embedded, fresh data dir)
# from openapi/openapi.json with schemathesis and fails on any 5xx, any
# answer that does not match the document (status, content type, headers,
# body schema), any schema-invalid request accepted (negative_data_rejection)
# and any schema-valid request refused for a reason its operation does not
# document (valid_data_is_accepted, in hooks.py: only rules a schema cannot
# say, such as `to` after `from`, each written in the operation's text).
# FASTACK_BIN names the binary (default target/debug/fastack).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${FASTACK_BIN:-$root/target/debug/fastack}
[ -x "$bin" ] || { echo "FAIL: no fastack binary at $bin (set FASTACK_BIN)" >&2; exit 1; }
venv=${CONTRACT_VENV:-$here/.venv}
if [ ! -x "$venv/bin/st" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r "$here/requirements.txt"
fi
data=$(mktemp -d)
log=$data/server.log
cleanup() { [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null || true; rm -rf "$data"; }
trap cleanup EXIT
FASTACK_DATA_DIR=$data/node FASTACK_LISTEN=127.0.0.1:0 FASTACK_LOG=info "$bin" serve 2>"$log" &
pid=$!
addr=""
for _ in $(seq 100); do
  addr=$(grep -o 'fastack listening addr=[0-9.:]*' "$log" | head -1 | cut -d= -f2 || true)
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || { cat "$log" >&2; echo "FAIL: the server did not start" >&2; exit 1; }
admin() { FASTACK_DATA_DIR=$data/node FASTACK_LOG=error "$bin" admin --json "$@"; }
admin tenant create --name contract --plan enterprise >/dev/null
key=$(admin key create --tenant contract | python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])')
cd "$here"
SCHEMATHESIS_HOOKS=hooks "$venv/bin/st" run "$root/openapi/openapi.json" \
  --url "http://$addr" -H "Authorization: Bearer $key" \
  --checks "${CONTRACT_CHECKS:-not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,valid_data_is_accepted,negative_data_rejection}" \
  --max-examples "${CONTRACT_MAX_EXAMPLES:-100}" --seed "${CONTRACT_SEED:-20261201}" \
  --workers 1 --no-color --exclude-path /metrics ${CONTRACT_EXTRA:-}

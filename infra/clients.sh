#!/usr/bin/env bash
# Generates the API's clients from the committed openapi.json and drives each against a running
# `tidings serve`: a Python one (openapi-python-client, PyPI) and a TypeScript one
# (openapi-typescript + openapi-fetch, npm). Installs the generators (infra/.venv, and
# tests/clients/typescript/node_modules from its package-lock.json), generates both clients
# (tests/clients/*/generated, not committed), type-checks the TypeScript end-to-end script
# (strict), starts `tidings serve` (embedded backend, a fresh data dir, one random API key) and
# runs tests/clients/python/e2e.py and tests/clients/typescript/e2e.ts against it. Any warning
# of a generator, type error or failed step fails the run.
#
# Run by infra/test.sh after schemathesis; alone: `bash infra/clients.sh` (needs
# target/debug/tidings or TIDINGS_BIN, infra/.venv and Node 20 with npm).
# `bash infra/clients.sh generate` only generates the two clients.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

root="$PWD"
BIN="${TIDINGS_BIN:-$root/target/debug/tidings}"
PORT="${CLIENTS_PORT:-18098}"
BASE="http://127.0.0.1:$PORT"
# CLIENTS_OPENAPI: another document to try (one not committed yet); CI uses the committed one.
DOC="${CLIENTS_OPENAPI:-$root/openapi.json}"
PY_DIR="$root/tests/clients/python"
TS_DIR="$root/tests/clients/typescript"
VENV="$root/infra/.venv"

fail() { echo "infra/clients.sh: $*" >&2; exit 1; }

[ -f "$DOC" ] || fail "no openapi.json at the repository root (cargo run -q -p tidings -- openapi > openapi.json)"

echo "-- install: openapi-python-client (infra/.venv), openapi-typescript, openapi-fetch and tsc (npm ci)"
[ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet 'openapi-python-client==0.29.1'
(cd "$TS_DIR" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)

echo "-- generate: the Python client (tests/clients/python/generated/tidings_client)"
rm -rf "$PY_DIR/generated"
mkdir -p "$PY_DIR/generated"
# --fail-on-warning: an operation or schema the generator skips is a failure, not a thinner client.
"$VENV/bin/openapi-python-client" generate --path "$DOC" --config "$PY_DIR/generator.yaml" \
    --meta none --output-path "$PY_DIR/generated/tidings_client" --fail-on-warning \
    || fail "openapi-python-client could not generate a client from $DOC"
[ -f "$PY_DIR/generated/tidings_client/client.py" ] || fail "openapi-python-client wrote no client"

echo "-- generate: the TypeScript types (tests/clients/typescript/generated/schema.d.ts)"
rm -rf "$TS_DIR/generated" "$TS_DIR/dist"
# redocly.yaml makes duplicate operationIds, unresolved references and malformed schemas errors.
(cd "$TS_DIR" && npx --no-install openapi-typescript "$DOC" -o generated/schema.d.ts --redocly redocly.yaml) \
    || fail "openapi-typescript could not generate types from $DOC"

if [ "${1:-}" = "generate" ]; then exit 0; fi

echo "-- type-check (tsc --noEmit, strict) and compile the TypeScript end-to-end script"
(cd "$TS_DIR" && npx --no-install tsc --noEmit -p . && npx --no-install tsc -p .) \
    || fail "tests/clients/typescript/e2e.ts does not type-check against the generated types"

echo "-- tidings serve on $BASE (embedded backend, a fresh data dir)"
work="$(mktemp -d)"
key="clients-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
TIDINGS_API_KEYS="clients:$key" TIDINGS_BACKEND=embedded TIDINGS_API_RATES=off \
    "$BIN" serve --addr "127.0.0.1:$PORT" --data-dir "$work/data" >"$work/serve.log" 2>&1 &
server=$!
cleanup() {
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

for _ in $(seq 1 100); do
    if curl -fsS "$BASE/healthz" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$server" 2>/dev/null; then
        echo "tidings serve exited:"; cat "$work/serve.log"; exit 1
    fi
    sleep 0.1
done
curl -fsS "$BASE/healthz" >/dev/null || fail "tidings serve did not answer /healthz"

status=0
echo "-- the Python client, end to end"
TIDINGS_URL="$BASE" TIDINGS_API_KEY="$key" PYTHONPATH="$PY_DIR/generated" "$VENV/bin/python" "$PY_DIR/e2e.py" \
    || status=$?
if [ "$status" -eq 0 ]; then
    echo "-- the TypeScript client, end to end"
    TIDINGS_URL="$BASE" TIDINGS_API_KEY="$key" node "$TS_DIR/dist/e2e.js" || status=$?
fi
if [ "$status" -ne 0 ]; then
    echo "== a generated client's end-to-end run failed (exit $status); the server's log:"
    tail -n 100 "$work/serve.log"
    exit "$status"
fi
echo "-- both generated clients passed"

echo "-- the README's quickstart and client snippets, as printed (infra/readme.sh)"
bash infra/readme.sh

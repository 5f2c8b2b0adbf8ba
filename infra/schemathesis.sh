#!/usr/bin/env bash
# Fuzzes the HTTP API from its own OpenAPI document (`GET /openapi.json`) with schemathesis:
# starts `tidings serve` (embedded backend, a fresh data dir, one random API key), runs every
# documented operation with generated valid and invalid input, and fails on any 5xx, any
# undocumented status and any response that breaks its schema. Run by infra/test.sh after the
# tests; alone: `bash infra/schemathesis.sh` (needs target/debug/tidings and infra/.venv).
#
# SCHEMATHESIS_MAX_EXAMPLES (default 100) sizes the run: about a minute on an idle machine;
# SCHEMATHESIS_SEED (default 7) picks the run (another seed tries other inputs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BIN="${TIDINGS_BIN:-$PWD/target/debug/tidings}"
PORT="${SCHEMATHESIS_PORT:-18099}"
MAX_EXAMPLES="${SCHEMATHESIS_MAX_EXAMPLES:-100}"
SEED="${SCHEMATHESIS_SEED:-7}"
PHASES="${SCHEMATHESIS_PHASES:-examples,coverage,fuzzing,stateful}"
# Every check, the request-side ones too: schema-valid requests accepted, schema-violating ones
# refused. infra/schemathesis.toml lists the statuses some operations answer schema-valid
# requests with beyond 2xx (the live feed's 426; rules between a request and the stored data).
CHECKS="${SCHEMATHESIS_CHECKS:-all}"
BASE="http://127.0.0.1:$PORT"

infra/.venv/bin/pip install --quiet 'schemathesis==4.32.5'

work="$(mktemp -d)"
key="schema-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
# The operator routes (`/v1/ops`, `/v1/admin`, `/dev`, `/metrics`) are fuzzed with an operator
# key (infra/schemathesis.toml gives it to them); the rest with the tenant key.
export SCHEMATHESIS_OPERATOR_KEY="op-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
# The SNS certificate is the test one, so callbacks never fetch one from the network. No rate
# limits: a 429 would cut a case short of the answer it checks.
TIDINGS_API_KEYS="schema:$key" TIDINGS_OPERATOR_KEYS="$SCHEMATHESIS_OPERATOR_KEY" TIDINGS_BACKEND=embedded TIDINGS_API_RATES=off \
    TIDINGS_SNS_TRUSTED_CERT_PEM="$PWD/tests/fixtures/sns/test-signing-cert.pem" \
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
curl -fsS "$BASE/healthz" >/dev/null

# Checks: no 5xx, only documented statuses and content types, bodies that match their schema,
# every schema-valid request taken and every schema-violating one refused.
# `/dev/clock/advance` is fuzzed too: without --manual-clock it answers 409 (documented).
# Run from the scratch dir: schemathesis keeps a cache in ./.schemathesis.
status=0
root="$PWD"
(cd "$work" && "$root/infra/.venv/bin/schemathesis" --config-file "$root/infra/schemathesis.toml" \
    run "$BASE/openapi.json" \
    --header "Authorization: Bearer $key" \
    --checks "$CHECKS" \
    --phases "$PHASES" \
    --max-examples "$MAX_EXAMPLES" \
    --seed "$SEED" \
    --workers 1 \
    --no-color \
    --suppress-health-check all \
    --request-timeout 10 \
    --generation-database none \
    --report-dir "$work/report") || status=$?
if [ "$status" -ne 0 ]; then
    echo "== schemathesis found problems (exit $status); the server's log:"
    tail -n 100 "$work/serve.log"
fi
exit "$status"

#!/usr/bin/env bash
# The README as printed: starts a fresh `tidings serve` (embedded backend, its defaults, a new
# data dir), pastes the `export` lines it prints into this shell, and runs the README's blocks
# marked `<!-- tested: ... -->` word for word: the quickstart with bash (`set -e`: any non-2xx of
# its `curl -fsS` fails), then the Python and TypeScript snippets with the clients
# infra/clients.sh generated. Then checks that the quickstart's send reached the fake providers
# (an email and an SMS to u1) and that each snippet's send was accepted and is known.
#
# Run by infra/clients.sh once both clients are generated and the TypeScript one compiles;
# alone: `bash infra/readme.sh` after `bash infra/clients.sh`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

root="$PWD"
BIN="${TIDINGS_BIN:-$root/target/debug/tidings}"
PORT="${README_PORT:-18099}"
PY_DIR="$root/tests/clients/python"
TS_DIR="$root/tests/clients/typescript"
VENV="$root/infra/.venv"

fail() { echo "infra/readme.sh: $*" >&2; exit 1; }

# The fenced block right after the `<!-- tested: NAME` marker of README.md.
block() {
    python3 - "$1" <<'PY'
import sys
lines = open("README.md", encoding="utf-8").read().split("\n")
name = sys.argv[1]
at = next((i for i, l in enumerate(lines) if l.startswith(f"<!-- tested: {name} ")), None)
if at is None or not lines[at + 1].startswith("```"):
    sys.exit(f"README.md has no block marked <!-- tested: {name} ... --> followed by a fence")
end = next(i for i in range(at + 2, len(lines)) if lines[i].startswith("```"))
print("\n".join(lines[at + 2:end]))
PY
}

work="$(mktemp -d)"
server=""
cleanup() {
    if [ -n "$server" ]; then
        kill "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
    fi
    rm -rf "$work" "$TS_DIR/readme.ts" "$TS_DIR/tsconfig.readme.json" "$TS_DIR/dist/readme.js"
}
trap cleanup EXIT

echo "-- tidings serve, as the README starts it (a fresh data dir, port $PORT)"
# Only what a newcomer's shell would not have: no TIDINGS_* variable leaks in from this run.
env -u TIDINGS_API_KEYS -u TIDINGS_OPERATOR_KEYS -u TIDINGS_BACKEND -u TIDINGS_URL -u TIDINGS_API_KEY -u TIDINGS_OPERATOR_KEY \
    "$BIN" serve --addr "127.0.0.1:$PORT" --data-dir "$work/data" >"$work/serve.out" 2>"$work/serve.log" &
server=$!
for _ in $(seq 1 200); do
    if grep -q "export TIDINGS_OPERATOR_KEY=" "$work/serve.out" 2>/dev/null && curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1; then break; fi
    kill -0 "$server" 2>/dev/null || { cat "$work/serve.out" "$work/serve.log"; fail "tidings serve exited"; }
    sleep 0.1
done
# The lines it printed to paste, pasted.
grep -E '^  export TIDINGS_(URL|API_KEY|OPERATOR_KEY)=' "$work/serve.out" >"$work/exports.sh" \
    || { cat "$work/serve.out"; fail "tidings serve printed no export lines"; }
[ "$(wc -l <"$work/exports.sh")" -eq 3 ] || { cat "$work/serve.out"; fail "tidings serve printed $(wc -l <"$work/exports.sh") of the 3 export lines"; }
# shellcheck disable=SC1091
. "$work/exports.sh"
[ "$TIDINGS_URL" = "http://127.0.0.1:$PORT" ] || fail "TIDINGS_URL is $TIDINGS_URL, not the listening address"

echo "-- the quickstart, as printed"
block quickstart >"$work/quickstart.sh"
(cd "$work" && bash -euo pipefail quickstart.sh) >"$work/quickstart.out" 2>&1 \
    || { cat "$work/quickstart.out"; tail -n 50 "$work/serve.log"; fail "the README's quickstart failed (above)"; }

# What it claims: one email and one SMS to u1 reach the providers, and the send reads completed.
for _ in $(seq 1 100); do
    got="$(curl -fsS "$TIDINGS_URL/dev/deliveries?user_id=u1" -H "Authorization: Bearer $TIDINGS_OPERATOR_KEY")"
    if python3 -c 'import json,sys; d=json.loads(sys.argv[1]); c=sorted(x["channel"] for x in d); sys.exit(0 if c==["email","sms"] else 1)' "$got"; then break; fi
    sleep 0.1
done
python3 - "$got" <<'PY' || fail "the quickstart's send did not reach the providers as the README says"
import json, sys
d = json.loads(sys.argv[1])
by = {x["channel"]: x for x in d}
assert sorted(by) == ["email", "sms"], f"deliveries: {d}"
assert by["email"]["to"] == "alice@example.com" and "123" in by["email"]["subject"], by["email"]
assert by["sms"]["body"] == "订单 123 已发货", by["sms"]
PY

echo "-- the Python snippet, as printed"
block python >"$work/readme.py"
PYTHONPATH="$PY_DIR/generated" "$VENV/bin/python" "$work/readme.py" >"$work/python.out" 2>&1 \
    || { cat "$work/python.out"; fail "the README's Python snippet failed (above)"; }
cat "$work/python.out"

echo "-- the TypeScript snippet, as printed (type-checked, strict, then run)"
block typescript >"$TS_DIR/readme.ts"
printf '{ "extends": "./tsconfig.json", "include": ["readme.ts", "generated/schema.d.ts"] }\n' >"$TS_DIR/tsconfig.readme.json"
(cd "$TS_DIR" && npx --no-install tsc -p tsconfig.readme.json) \
    || fail "the README's TypeScript snippet does not type-check against the generated types"
node "$TS_DIR/dist/readme.js" >"$work/ts.out" 2>&1 || { cat "$work/ts.out"; fail "the README's TypeScript snippet failed (above)"; }
cat "$work/ts.out"

# Each snippet's send is a notification of its own (three in all, none refused as a conflict).
count="$(curl -fsS "$TIDINGS_URL/v1/notifications?limit=10" -H "Authorization: Bearer $TIDINGS_API_KEY" \
    | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["items"]))')"
[ "$count" -eq 3 ] || fail "expected the quickstart's and each snippet's notification (3), found $count"
echo "-- the README's quickstart and both snippets ran as printed"

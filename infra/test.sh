#!/usr/bin/env bash
# `make test`: installs what the tests need (moto's server in infra/.venv, DynamoDB Local in
# infra/.ddb, SAM CLI and cargo-lambda in infra/.venv-sam, the lint tools), builds what a shop
# deploys (`sam build`: infra/sam.sh), starts the emulators on loopback (moto for SQS, SNS and SES;
# DynamoDB Local, behind its conflict layer, for DynamoDB and its streams), runs every test on
# both backends, lints the SAM template, and stops the emulators. Exits non-zero on any failure;
# no test is skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# A CI run builds from nothing: incremental compilation only adds gigabytes of session caches for
# the workspace's crates (9 GB seen in one target directory) on a disk the run shares.
export CARGO_INCREMENTAL=0
# The builds of this run take about 15 GB (debug tests, clippy, the arm64 release of the eight
# functions). Say how much the disk has before starting, so a full disk reads as what it is.
avail_kb=$(df -Pk . | awk 'NR==2 {print $4}')
echo "== disk: $(( avail_kb / 1024 / 1024 )) GB free where the build goes (about 15 GB needed)"
if [ "$avail_kb" -lt $(( 15 * 1024 * 1024 )) ]; then
    echo "infra/test.sh: warning: less than 15 GB free; the build may stop with 'No space left on device'" >&2
fi

export MOTO_PORT="${MOTO_PORT:-5005}"
export DYNAMODB_LOCAL_PORT="${DYNAMODB_LOCAL_PORT:-5006}"
# A second DynamoDB Local (and conflict layer) for the stacks of function binaries: DynamoDB Local
# runs every write under one lock, and a 2,000-member campaign through the functions held it
# long enough for the other tests' handlers to outrun their deadlines (infra/README.md).
functions_port="${DYNAMODB_FUNCTIONS_PORT:-5008}"
trap 'bash infra/moto.sh stop >/dev/null 2>&1 || true; bash infra/dynamodb_local.sh stop >/dev/null 2>&1 || true; DYNAMODB_LOCAL_PORT=$functions_port bash infra/dynamodb_local.sh stop >/dev/null 2>&1 || true' EXIT
bash infra/moto.sh start >/dev/null
bash infra/dynamodb_local.sh start >/dev/null
DYNAMODB_LOCAL_PORT="$functions_port" bash infra/dynamodb_local.sh start >/dev/null
export TIDINGS_TEST_DYNAMODB_FUNCTIONS="http://127.0.0.1:$functions_port"
export TIDINGS_TEST_DYNAMODB_FUNCTIONS_STREAMS="http://127.0.0.1:$((functions_port + 1))"
set -a
# AWS_ENDPOINT_URL names moto; the SDK takes AWS_ENDPOINT_URL_DYNAMODB{,_STREAMS} over it.
eval "$(bash infra/moto.sh env)"
eval "$(bash infra/dynamodb_local.sh env)"
set +a

echo "== Debian packages: chromium + chromedriver (the console test), wrk (the HTTP reservation bench's test)"
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1 || ! command -v wrk >/dev/null 2>&1; then
    sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium chromium-driver wrk >/dev/null
fi
infra/.venv/bin/pip install --quiet selenium
export TIDINGS_TEST_PYTHON="$PWD/infra/.venv/bin/python"

echo "== the deploy build: sam build, one arm64 bootstrap per function (the end-to-end suite runs them)"
bash infra/sam.sh
# The tests run the bootstraps sam build copied into .aws-sam/build, not cargo's arm64 build
# directory (3-4 GB). Where the disk is short for the debug builds to come, that directory goes:
# the next `make test` then builds the functions from the start (15 minutes) instead of reusing it.
avail_kb=$(df -Pk . | awk 'NR==2 {print $4}')
if [ "$avail_kb" -lt $(( 12 * 1024 * 1024 )) ]; then
    echo "== disk: $(( avail_kb / 1024 / 1024 )) GB free after sam build; removing target/aarch64-unknown-linux-gnu and target/lambda"
    rm -rf target/aarch64-unknown-linux-gnu target/lambda
fi

echo "== build (the tidings binary with the AWS backend and crash points, for the end-to-end tests)"
cargo build --locked -p tidings --features aws,crash-points
# A copy: the test build below may rebuild target/debug/tidings with other features.
mkdir -p target/e2e && cp target/debug/tidings target/e2e/tidings
export TIDINGS_BIN="$PWD/target/e2e/tidings"

echo "== tests (unit, handler fixtures, conformance and end to end on both backends)"
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --locked --workspace --no-fail-fast --test-threads 4
    # nextest does not run doc tests
    cargo test --locked --workspace --doc
else
    cargo test --locked --workspace --no-fail-fast
fi

echo "== schemathesis (the API fuzzed from its own /openapi.json: no 5xx, no schema violation)"
bash infra/schemathesis.sh

echo "== generated clients (Python and TypeScript, from openapi.json, end to end against tidings serve)"
bash infra/clients.sh

echo "== the book (docs/, mdBook; its links are checked by tests/docs_refs.rs)"
bash infra/book.sh

echo "== clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings

echo "== template.yaml"
bash infra/lint.sh
echo "== disk after the run: $(du -sh target 2>/dev/null | cut -f1) in target/"
echo "== all green"

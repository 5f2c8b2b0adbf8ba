#!/usr/bin/env bash
# Installs the SAM tools into infra/.venv-sam when missing, pinned (a new release cannot turn a
# clean build or template red overnight; bump the pins on purpose): AWS SAM CLI, cargo-lambda
# (with zig, which links the arm64 binaries) and cfn-lint. Sourced by infra/sam.sh and
# infra/lint.sh; sets `venv`.
SAM_CLI_VERSION="${SAM_CLI_VERSION:-1.170.0}"
CARGO_LAMBDA_VERSION="${CARGO_LAMBDA_VERSION:-1.9.2}"
CFN_LINT_VERSION="${CFN_LINT_VERSION:-1.58.0}"

venv="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/.venv-sam"
if [[ ! -x "$venv/bin/sam" || ! -x "$venv/bin/cargo-lambda" || ! -x "$venv/bin/cfn-lint" ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "aws-sam-cli==$SAM_CLI_VERSION" "cargo-lambda==$CARGO_LAMBDA_VERSION" "cfn-lint==$CFN_LINT_VERSION"
fi

#!/usr/bin/env bash
# Lints template.yaml with cfn-lint and `sam validate --lint`, offline.
#
#   bash infra/lint.sh
#
# Installs both tools into infra/.venv-lint when missing (pinned, so a new linter release
# cannot turn a clean template red overnight; bump the pins on purpose). Exits non-zero on
# any finding, warnings included: cfn-lint exits 4 on a warning, 2 on an error, and
# `sam validate --lint` fails on either.
set -euo pipefail

CFN_LINT_VERSION="${CFN_LINT_VERSION:-1.58.0}"
SAM_CLI_VERSION="${SAM_CLI_VERSION:-1.170.0}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="$here/.venv-lint"

if [[ ! -x "$venv/bin/cfn-lint" || ! -x "$venv/bin/sam" ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "cfn-lint==$CFN_LINT_VERSION" "aws-sam-cli==$SAM_CLI_VERSION"
fi

cd "$root"

# Neither command calls AWS with --lint, but SAM CLI wants a region and would pick up real
# credentials or a profile if any were around: give it dummies and no telemetry.
export AWS_ACCESS_KEY_ID=lint AWS_SECRET_ACCESS_KEY=lint AWS_SESSION_TOKEN=lint
export AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
unset AWS_PROFILE AWS_ENDPOINT_URL
export SAM_CLI_TELEMETRY=0

echo "== cfn-lint template.yaml"
"$venv/bin/cfn-lint" template.yaml
echo "cfn-lint: no findings"

echo "== sam validate --lint --template template.yaml --region us-east-1"
"$venv/bin/sam" validate --lint --template template.yaml --region us-east-1

#!/usr/bin/env bash
# Lints template.yaml with cfn-lint and `sam validate --lint`, offline.
#
#   bash infra/lint.sh
#
# Installs both tools into infra/.venv-sam when missing (infra/sam-tools.sh, pinned). Exits non-zero on
# any finding, warnings included: cfn-lint exits 4 on a warning, 2 on an error, and
# `sam validate --lint` fails on either.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
# shellcheck source=infra/sam-tools.sh
source "$here/sam-tools.sh"

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

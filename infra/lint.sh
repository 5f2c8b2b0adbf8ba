#!/usr/bin/env bash
# Lints template.yaml with cfn-lint and `sam validate --lint`, offline.
#
#   bash infra/lint.sh
#
# Installs both tools into infra/.venv-lint when missing. Exits non-zero on any finding,
# warnings included (cfn-lint exits 0 only when it has nothing to say).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="$here/.venv-lint"

if [[ ! -x "$venv/bin/cfn-lint" || ! -x "$venv/bin/sam" ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check cfn-lint aws-sam-cli
fi

cd "$root"

# Neither command calls AWS with --lint, but SAM CLI insists on a region and reads credentials
# if they are around: give it dummies and keep it from phoning home.
export AWS_ACCESS_KEY_ID=lint AWS_SECRET_ACCESS_KEY=lint AWS_SESSION_TOKEN=lint
export AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
unset AWS_PROFILE AWS_ENDPOINT_URL
export SAM_CLI_TELEMETRY=0

echo "== cfn-lint template.yaml"
"$venv/bin/cfn-lint" template.yaml
echo "cfn-lint: no findings"

echo "== sam validate --lint"
"$venv/bin/sam" validate --lint --template template.yaml --region us-east-1

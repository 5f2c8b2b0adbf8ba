#!/usr/bin/env bash
# The deploy build, as a shop runs it: `sam build` (samconfig.toml turns on the beta Rust
# builder), which runs `cargo lambda build --release --arm64 --bin <fn>` in each function's
# directory and leaves `.aws-sam/build/<Function>/bootstrap`. The end-to-end tests then run those
# very binaries (tests/e2e/lambda), under qemu-aarch64 on a machine that is not arm64.
#
#   bash infra/sam.sh            # installs what is missing, builds, checks one bootstrap per function
#
# Installs when missing: AWS SAM CLI and cargo-lambda (infra/sam-tools.sh: PyPI, pinned, into
# infra/.venv-sam; cargo-lambda brings zig, which links for arm64), Rust's aarch64-unknown-linux-gnu standard
# library (rustup), and Debian's qemu-user and libc6-arm64-cross (to run the binaries here).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
# shellcheck source=infra/sam-tools.sh
source "$here/sam-tools.sh"

if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    rustup target add aarch64-unknown-linux-gnu
fi
if [[ "$(uname -m)" != "aarch64" ]] && { ! command -v qemu-aarch64 >/dev/null 2>&1 || [[ ! -d /usr/aarch64-linux-gnu/lib ]]; }; then
    sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq qemu-user libc6-arm64-cross >/dev/null
fi

cd "$root"
# SAM CLI wants a region and must not pick up real credentials; no telemetry.
export AWS_ACCESS_KEY_ID=build AWS_SECRET_ACCESS_KEY=build AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
unset AWS_PROFILE AWS_SESSION_TOKEN
export SAM_CLI_TELEMETRY=0
export PATH="$venv/bin:$PATH"
started=$(date +%s)
# sam build runs one `cargo lambda build --bin <fn>` per function, one after another, and each
# ends in a fat-LTO link on one core. One cargo invocation for every function of the template
# first links two at a time on two cores (9.4 min here for a change to tidings-core, against 18
# one by one); sam build then finds each binary fresh (the same profile, target and features:
# every function crate depends on tidings-functions alone) and only copies it.
mapfile -t dirs < <(grep -oE 'CodeUri: functions/[a-z-]+' template.yaml | sed 's#CodeUri: functions/##' | sort -u)
packages=()
for dir in "${dirs[@]}"; do
    packages+=(-p "$dir")
done
(cd "functions/${dirs[0]}" && cargo lambda build --release --arm64 "${packages[@]}")
prebuilt=$(date +%s)
echo "cargo lambda build (every function): $(( prebuilt - started )) s"
sam build
echo "sam build (copies the binaries): $(( $(date +%s) - prebuilt )) s"

# One bootstrap per function of the template.
missing=0
for fn in $(grep -B1 -A0 'Type: AWS::Serverless::Function' template.yaml | grep -oE '^  [A-Za-z]+Function' | tr -d ' '); do
    f=".aws-sam/build/$fn/bootstrap"
    if [[ -x "$f" ]]; then
        echo "$fn: $(stat -c %s "$f") bytes"
    else
        echo "sam.sh: $f is missing" >&2
        missing=1
    fi
done
exit "$missing"

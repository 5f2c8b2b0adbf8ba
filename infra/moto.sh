#!/usr/bin/env bash
# A local AWS emulator (moto's server) on loopback, for the AWS backend's tests and
# `tidings serve --backend aws`.
#
#   infra/moto.sh start   # installs moto in infra/.venv when missing, starts it, prints the env
#   infra/moto.sh env     # prints the env lines (eval "$(infra/moto.sh env)")
#   infra/moto.sh stop    # stops it
#
# MOTO_PORT (default 5005) picks the port; MOTO_SPEC (default 'moto[server]>=5.2,<6') what pip
# installs.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
run="$here/.run"
port="${MOTO_PORT:-5005}"
pidfile="$run/moto-$port.pid"
logfile="$run/moto-$port.log"
url="http://127.0.0.1:$port"

print_env() {
    echo "AWS_ENDPOINT_URL=$url"
    echo "AWS_REGION=us-east-1"
    echo "AWS_ACCESS_KEY_ID=test"
    echo "AWS_SECRET_ACCESS_KEY=test"
    # moto has no SQS StartMessageMoveTask.
    echo "TIDINGS_REDRIVE_MODE=receive-and-resend"
}

answers() {
    # Any HTTP answer means the server is up.
    python3 - "$url" <<'PY' >/dev/null 2>&1
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(sys.argv[1] + "/moto-api/", timeout=1)
except urllib.error.HTTPError:
    pass
PY
}

running() {
    [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

install() {
    if [[ ! -x "$venv/bin/moto_server" ]]; then
        echo "moto.sh: installing moto[server] into $venv" >&2
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --upgrade pip >&2
        "$venv/bin/pip" install --quiet "${MOTO_SPEC:-moto[server]>=5.2,<6}" >&2
    fi
}

start() {
    mkdir -p "$run"
    if running; then
        echo "moto.sh: already running (pid $(cat "$pidfile"))" >&2
        print_env
        return 0
    fi
    if answers; then
        echo "moto.sh: something already answers on $url; not starting another" >&2
        print_env
        return 0
    fi
    install
    # moto with its SQS made linear: see moto_server.py.
    nohup "$venv/bin/python" "$here/moto_server.py" -H 127.0.0.1 -p "$port" >"$logfile" 2>&1 &
    echo $! >"$pidfile"
    for _ in $(seq 1 100); do
        if answers; then
            echo "moto.sh: moto is up on $url (pid $(cat "$pidfile"), log $logfile)" >&2
            print_env
            return 0
        fi
        if ! running; then
            echo "moto.sh: moto exited; see $logfile" >&2
            tail -n 20 "$logfile" >&2 || true
            exit 1
        fi
        sleep 0.2
    done
    echo "moto.sh: moto did not answer on $url within 20s; see $logfile" >&2
    exit 1
}

stop() {
    if running; then
        local pid
        pid="$(cat "$pidfile")"
        kill "$pid"
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        echo "moto.sh: stopped (pid $pid)" >&2
    else
        echo "moto.sh: not running" >&2
    fi
    rm -f "$pidfile"
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

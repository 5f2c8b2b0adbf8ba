#!/usr/bin/env bash
# The Redis Lua gate of reserve-peers.sh (check-and-DECRBY on one key) made as durable as an
# order on Tidings' embedded backend: the append-only file on and fsynced before each answer
# (`appendfsync always`; Redis then syncs once per pass of its event loop for every write made
# in it, a group commit as Tidings' writer makes). `tidings bench reserve` runs it beside the
# peers of ../shared/bench (it carries a copy of this file). Prints ops/s, and fails unless the
# key lost exactly one unit per request.
# Usage: redis-durable-gate.sh [seconds] [clients]
set -eu
secs=${1:-10}; clients=${2:-16}
work=$(mktemp -d -t rdur.XXXX)
trap 'kill $(cat $work/redis.pid 2>/dev/null) 2>/dev/null; rm -rf $work' EXIT
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
redis-server --port $port --bind 127.0.0.1 --save '' --appendonly yes --appendfsync always \
  --dir $work --daemonize yes --pidfile $work/redis.pid --logfile $work/redis.log
for _ in $(seq 100); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.05; done
[ "$(redis-cli -p $port config get appendfsync | tail -1)" = always ] || { echo "appendfsync is not always" >&2; exit 1; }
redis-cli -p $port set stock:1 1000000000 >/dev/null
sha=$(redis-cli -p $port script load "local s=redis.call('GET',KEYS[1]) if not s then return -2 end if tonumber(s)<tonumber(ARGV[1]) then return -1 end return redis.call('DECRBY',KEYS[1],ARGV[1])")
# About 20,000 synced answers a second at 16 clients on a 2-vCPU machine: n makes it last
# about `secs` there (redis-benchmark has no duration of its own).
n=$((secs * 20000))
rps=$(redis-benchmark -p $port -c $clients -n $n -q evalsha $sha 1 stock:1 1 2>/dev/null | tr '\r' '\n' | grep -oE '[0-9.]+ requests per second' | grep -oE '^[0-9.]+' | tail -1)
left=$(redis-cli -p $port get stock:1)
[ "$left" = $((1000000000 - n)) ] || { echo "stock:1 is $left after $n requests" >&2; exit 1; }
echo "redis-lua-gate-fsync-always ops/s: $rps"

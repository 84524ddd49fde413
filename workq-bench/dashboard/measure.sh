#!/usr/bin/env bash
# The cost of `wq dashboard` against N queues on one Redis server: the connections it holds
# and the time of one `GET /api/queues`, for N = 10, 100 and 1,000 (or the counts given).
#
# Usage: workq-bench/dashboard/measure.sh [WQ_BINARY] [N...]
# Needs redis-server, redis-cli and curl. Starts its own server on a free loopback port with a
# temporary data directory, and stops it and the dashboard by PID.
#
# Each queue holds one ready item, one delayed item, one item under a lease, one failing item
# and one dead letter, written as the queue's scripts would write them. Figures: the first
# request, sent as soon as the dashboard listens (its sampler lists the queues at the same
# time), then the median of 5 more once the server's client count has settled, and the
# clients the server counts (`connected_clients`, less the one asking) after each.
set -euo pipefail

wq=${1:-target/release/wq}
shift || true
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(10 100 1000)

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

dir=$(mktemp -d)
redis_pid=""
dash_pid=""
cleanup() {
    [ -n "$dash_pid" ] && kill "$dash_pid" 2>/dev/null || true
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

port=$(free_port)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
    --logfile redis.log --maxclients 20000 &
redis_pid=$!
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
cli() { redis-cli -p "$port" "$@"; }

clients() { cli info clients | tr -d '\r' | awk -F: '/^connected_clients/ {print $2 - 1}'; }

printf '%-8s %-14s %-14s %-16s %-16s\n' queues first_ms warm_ms clients_first clients_warm
for n in "${counts[@]}"; do
    cli flushall >/dev/null
    now_us=$(( $(date +%s) * 1000000 ))
    far=$(( now_us + 3600 * 1000000 ))
    {
        for i in $(seq 1 "$n"); do
            k="wq:{q$i}"
            printf 'RPUSH %s:ready "\\"a\\""\n' "$k"
            printf 'SADD %s:dirty "\\"a\\""\n' "$k"
            printf 'ZADD %s:delay %s "\\"b\\""\n' "$k" "$far"
            printf 'HSET %s:fail "\\"c\\"" 2\n' "$k"
            printf 'ZADD %s:proc %s "\\"e\\""\n' "$k" "$far"
            printf 'HSET %s:lease "\\"e\\"" 7\n' "$k"
            printf 'HSET %s:since "\\"e\\"" %s\n' "$k" "$now_us"
            printf 'RPUSH %s:dead "{\\"item\\":\\"\\\\\\"d\\\\\\"\\",\\"error\\":\\"x\\",\\"at_ms\\":1,\\"stalls\\":0,\\"failures\\":0,\\"token\\":\\"1\\"}"\n' "$k"
        done
    } | cli >/dev/null
    "$wq" dashboard --redis "redis://127.0.0.1:$port/" --addr 127.0.0.1:0 --sample-every 3600 \
        > "$dir/dash.out" 2> "$dir/dash.err" &
    dash_pid=$!
    for _ in $(seq 200); do grep -q http:// "$dir/dash.out" 2>/dev/null && break; sleep 0.05; done
    addr=$(grep -o 'http://[^/]*' "$dir/dash.out" | head -1)
    cold=$(curl -s -o "$dir/q.json" -w '%{time_total}' "$addr/api/queues")
    listed=$(jq '.queues | length' "$dir/q.json" 2>/dev/null || echo "?")
    cc=$(clients)
    prev=-1
    for _ in $(seq 120); do c=$(clients); [ "$c" = "$prev" ] && break; prev=$c; sleep 1; done
    times=()
    for _ in 1 2 3 4 5; do times+=("$(curl -s -o /dev/null -w '%{time_total}' "$addr/api/queues")"); done
    warm=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 3p)
    cw=$(clients)
    printf '%-8s %-14s %-14s %-16s %-16s (listed %s)\n' "$n" \
        "$(awk -v t="$cold" 'BEGIN{printf "%.1f", t*1000}')" \
        "$(awk -v t="$warm" 'BEGIN{printf "%.1f", t*1000}')" "$cc" "$cw" "$listed"
    kill "$dash_pid"; wait "$dash_pid" 2>/dev/null || true; dash_pid=""
done

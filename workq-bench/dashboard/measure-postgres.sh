#!/usr/bin/env bash
# The cost of `wq dashboard --postgres` against N queues in one PostgreSQL database: the
# connections it holds and the time of one `GET /api/queues`, for N = 10, 100 and 1,000 (or
# the counts given). The PostgreSQL twin of measure.sh.
#
# Usage: workq-bench/dashboard/measure-postgres.sh [WQ_BINARY] [N...]
# Needs PostgreSQL's initdb, postgres and psql ($WQ_PG_BIN, the PATH, or the newest
# /usr/lib/postgresql/*/bin), curl and jq. Starts its own server on a free loopback port with
# a temporary data directory (as the user postgres when run as root), default settings, and
# stops it and the dashboard by PID.
#
# The schema is installed by a one-event `wq demo --postgres` (whose queue is then deleted).
# Each queue holds one ready item, one delayed item, one item under a lease, one failing item
# and one dead letter, written with SQL as the queue's functions would leave them. Figures:
# the first request, sent as soon as the dashboard listens (its sampler lists the queues at
# the same time), then the median of 5 more, and the server connections the dashboard holds
# (`pg_stat_activity`, application_name wq-dashboard) after each.
set -euo pipefail

wq=${1:-target/release/wq}
shift || true
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(10 100 1000)

bin=${WQ_PG_BIN:-}
if [ -z "$bin" ]; then
    if command -v initdb >/dev/null 2>&1; then
        # A link on the PATH (as /usr/local/bin/initdb) leads to the directory of them all.
        bin=$(dirname "$(readlink -f "$(command -v initdb)")")
    else
        bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
    fi
fi
[ -x "$bin/initdb" ] || { echo "initdb not found: install postgresql or set WQ_PG_BIN" >&2; exit 1; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

dir=$(mktemp -d)
as_server=()
if [ "$(id -u)" = 0 ]; then
    chown postgres: "$dir"
    as_server=(runuser -u postgres --)
fi
dash_pid=""
cleanup() {
    [ -n "$dash_pid" ] && kill "$dash_pid" 2>/dev/null || true
    # The postmaster's PID (under runuser, the child is not it); SIGINT: a fast shutdown.
    if [ -f "$dir/data/postmaster.pid" ]; then
        kill -INT "$(head -1 "$dir/data/postmaster.pid")" 2>/dev/null || true
    fi
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

"${as_server[@]}" "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C \
    >/dev/null
port=$(free_port)
"${as_server[@]}" "$bin/postgres" -D "$dir/data" -p "$port" -k "$dir" \
    -c listen_addresses=127.0.0.1 > "$dir/pg.log" 2>&1 &
url="postgres://postgres@127.0.0.1:$port/postgres"
sql() { "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA "$@"; }
for _ in $(seq 200); do sql -c 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.05; done

"$wq" demo --postgres "$url" --queue measure-setup --objects 1 --events 1 --duration 10ms \
    --no-progress > /dev/null 2>&1
sql -c "TRUNCATE workqueue_items, workqueue_failures, workqueue_dead; DELETE FROM workqueue_queues"

held() {
    sql -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'wq-dashboard'"
}

printf '%-8s %-14s %-14s %-16s %-16s\n' queues first_ms warm_ms conns_first conns_warm
for n in "${counts[@]}"; do
    sql <<SQL
TRUNCATE workqueue_items, workqueue_failures, workqueue_dead;
DELETE FROM workqueue_queues;
INSERT INTO workqueue_queues (name) SELECT 'q' || i FROM generate_series(1, $n) i;
INSERT INTO workqueue_items (queue, key, item, ready, avail_at, seq)
    SELECT id, workqueue_key('"a"'), '"a"', true, clock_timestamp(), nextval('workqueue_seq')
    FROM workqueue_queues;
INSERT INTO workqueue_items (queue, key, item, due, seq)
    SELECT id, workqueue_key('"b"'), '"b"', now() + interval '1 hour', nextval('workqueue_seq')
    FROM workqueue_queues;
INSERT INTO workqueue_items (queue, key, item, seq, token, lease_until, leased_at)
    SELECT id, workqueue_key('"e"'), '"e"', nextval('workqueue_seq'), nextval('workqueue_seq'),
           now() + interval '1 hour', now()
    FROM workqueue_queues;
INSERT INTO workqueue_failures (queue, key, item, failures)
    SELECT id, workqueue_key('"c"'), '"c"', 2 FROM workqueue_queues;
INSERT INTO workqueue_dead (queue, item, reason, stalls, failures)
    SELECT id, '"d"', 'x', 0, 0 FROM workqueue_queues;
ANALYZE;
SQL
    "$wq" dashboard --postgres "$url" --addr 127.0.0.1:0 --sample-every 3600 \
        > "$dir/dash.out" 2> "$dir/dash.err" &
    dash_pid=$!
    for _ in $(seq 200); do grep -q http:// "$dir/dash.out" 2>/dev/null && break; sleep 0.05; done
    addr=$(grep -o 'http://[^/]*' "$dir/dash.out" | head -1)
    cold=$(curl -s -o "$dir/q.json" -w '%{time_total}' "$addr/api/queues")
    listed=$(jq '.queues | length' "$dir/q.json" 2>/dev/null || echo "?")
    cf=$(held)
    times=()
    for _ in 1 2 3 4 5; do times+=("$(curl -s -o /dev/null -w '%{time_total}' "$addr/api/queues")"); done
    warm=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 3p)
    cw=$(held)
    printf '%-8s %-14s %-14s %-16s %-16s (listed %s)\n' "$n" \
        "$(awk -v t="$cold" 'BEGIN{printf "%.1f", t*1000}')" \
        "$(awk -v t="$warm" 'BEGIN{printf "%.1f", t*1000}')" "$cf" "$cw" "$listed"
    kill "$dash_pid"; wait "$dash_pid" 2>/dev/null || true; dash_pid=""
done

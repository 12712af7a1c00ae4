#!/usr/bin/env bash
# ctest's run of example_unpaid_orders_transactional: a private PostgreSQL server (initdb in a
# temporary directory, a free loopback port, as the postgres user when run as root, killed by the
# kernel if this script dies), the example against it, and the server stopped at the end.
#   unpaid_orders_transactional.sh EXAMPLE
set -euo pipefail
exe=$1
bindir=${DELAYQ_PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
[ -x "$bindir/postgres" ] || { echo "PostgreSQL not found (apt-get install postgresql)" >&2; exit 1; }
dir=$(mktemp -d /tmp/delayq-pg-example-XXXXXX)
as=(setpriv --pdeathsig KILL)
if [ "$(id -u)" -eq 0 ]; then
    chown postgres "$dir"
    as=(setpriv --reuid=postgres --regid=postgres --clear-groups --pdeathsig KILL)
fi
pid=
cleanup() {
    if [ -n "$pid" ]; then kill -INT "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$dir"
}
trap cleanup EXIT
"${as[@]}" "$bindir/initdb" -D "$dir/data" -A trust -U postgres --no-sync >"$dir/initdb.log" 2>&1
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${as[@]}" "$bindir/postgres" -D "$dir/data" -p "$port" -k "$dir" \
    -c listen_addresses=127.0.0.1 >"$dir/server.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
    "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" && break
    sleep 0.05
done
"$exe" "host=127.0.0.1 port=$port user=postgres dbname=postgres"

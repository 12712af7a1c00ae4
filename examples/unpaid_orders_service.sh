#!/usr/bin/env bash
# example_unpaid_orders_service as a service: started, fed 9 orders by a second process (the
# shop), stopped with SIGTERM once it handled them. It must handle each order once, exit 0 on the
# signal, and leave nothing queued. ctest runs it (label example).
#   unpaid_orders_service.sh EXAMPLE
set -euo pipefail
example=$1
dir=$(mktemp -d)
trap 'kill -9 "${pid:-}" 2>/dev/null || true; rm -rf "$dir"' EXIT
"$example" --file "$dir/orders.queue" >"$dir/out" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q '^running' "$dir/out" && break; sleep 0.1; done
"$example" --file "$dir/orders.queue" --put 9
for _ in $(seq 600); do [ "$(grep -c '^order-' "$dir/out")" -ge 9 ] && break; sleep 0.1; done
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
cat "$dir/out"
[ "$rc" -eq 0 ] || { echo "FAIL: the service exited with $rc on SIGTERM, not 0" >&2; exit 1; }
[ "$(grep -c '^order-' "$dir/out")" -eq 9 ] || { echo "FAIL: not 9 orders handled once each" >&2; exit 1; }
[ "$(grep -c 'cancelled$' "$dir/out")" -eq 6 ] || { echo "FAIL: not 6 unpaid orders cancelled" >&2; exit 1; }
grep -q '^stopped by signal 15: 9 orders done, 0 queued$' "$dir/out" || { echo "FAIL: no clean stop" >&2; exit 1; }
echo "ok: 9 orders handled once each, stopped by SIGTERM, exit 0, nothing left queued"

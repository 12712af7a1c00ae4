#!/usr/bin/env bash
# The Redis pair across processes, with a consumer killed mid-job: a private redis-server on a
# free loopback port, the producer queues three reminders due 200, 400 and 600 ms from now,
# consumer A (lease 1 s) takes the first and is killed with SIGKILL while it works on it, and
# consumer B, started after, gets all three: the killed one again, attempt 2, once A's lease has
# ended. Nothing is lost. ctest runs it (label example) when redis-server is installed.
#   kill_and_redeliver.sh PRODUCER CONSUMER
set -euo pipefail
producer=$1 consumer=$2
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
# A free port can be taken by another test's server between the look and the bind: then this
# server exits, and the script tries another port (it fails, saying why, after 10 tries).
up=0
for _ in $(seq 10); do
    port=$((20000 + RANDOM % 20000))
    while (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null; do port=$((port + 1)); done
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
        --daemonize no >"$dir/redis.log" 2>&1 &
    server=$!
    for _ in $(seq 200); do
        if redis-cli -p "$port" ping >/dev/null 2>&1; then up=1; break; fi
        kill -0 "$server" 2>/dev/null || break  # it exited: the port was taken
        sleep 0.05
    done
    [ "$up" -eq 1 ] && break
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
done
if [ "$up" -ne 1 ]; then
    echo "redis-server did not start (last log below)" >&2
    cat "$dir/redis.log" >&2
    exit 1
fi

echo "== producer"
"$producer" 127.0.0.1 "$port" 3 200
echo "== consumer A (lease 1 s, each job takes 10 s): killed with SIGKILL mid-job"
"$consumer" 127.0.0.1 "$port" 1000 10000 5 >"$dir/a.out" 2>&1 &
a=$!
for _ in $(seq 100); do grep -q attempt "$dir/a.out" && break; sleep 0.05; done
{ kill -9 "$a" && wait "$a"; } 2>/dev/null || true  # quietly: the shell would say "Killed"
sed 's/^/  A: /' "$dir/a.out"
echo "== consumer B (lease 1 s): gets the rest, and A's job once A's lease ends"
"$consumer" 127.0.0.1 "$port" 1000 0 2 | tee "$dir/b.out" | sed 's/^/  B: /'
taken=$(grep -c attempt "$dir/b.out" || true)
again=$(grep -c 'attempt 2' "$dir/b.out" || true)
echo "B ran $taken reminders, $again of them redelivered after A was killed"
[ "$taken" -eq 3 ] && [ "$again" -eq 1 ]

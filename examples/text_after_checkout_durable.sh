#!/usr/bin/env bash
# example_text_after_checkout_durable killed with SIGKILL mid-flow, then run again on the same file:
# run 1 queues seven texts and kills itself after its 3rd text, before that text's ack; run 2 finds
# the file, sends every text left (the 3rd again, once its lease ends) and removes the file. From
# their output: every text queued went out at least once, none before its due time, and the one
# whose ack the kill lost went out again. ctest runs it (label example).
#   text_after_checkout_durable.sh EXAMPLE
set -euo pipefail
example=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
file=$dir/texts.queue

echo "== run 1, --crash-after 3"
rc=0
{ "$example" --file "$file" --crash-after 3 >"$dir/1.out" 2>&1; } 2>/dev/null || rc=$? # no "Killed"
cat "$dir/1.out"
if [ "$rc" -ne 137 ]; then
    echo "FAIL: run 1 exited with $rc, not 137 (killed by SIGKILL)" >&2
    exit 1
fi
[ -e "$file" ] || { echo "FAIL: no queue file after run 1" >&2; exit 1; }

echo "== run 2, on the same file"
rc=0
"$example" --file "$file" >"$dir/2.out" 2>&1 || rc=$?
cat "$dir/2.out"
if [ "$rc" -ne 0 ]; then
    echo "FAIL: run 2 exited with $rc" >&2
    exit 1
fi
[ ! -e "$file" ] || { echo "FAIL: run 2 left the queue file" >&2; exit 1; }

# Both outputs: "checkout: order #N, ... due D ms after checkout" for each text queued, and
# "texted ... order #N? E ms after checkout" for each text sent.
cat "$dir/1.out" "$dir/2.out" | awk -v run1="$(grep -c ' texted ' "$dir/1.out" || true)" \
    -v crashed="$(grep -c '^  crash: ' "$dir/1.out" || true)" \
    -v again="$(grep -c ' texted .*(attempt [2-9]' "$dir/2.out" || true)" '
    function field(re,    s) { if (!match($0, re)) return -1; s = substr($0, RSTART, RLENGTH)
                               gsub(/[^0-9]/, "", s); return s + 0 }
    / checkout: / { due[field("order #[0-9]+")] = field("[0-9]+ ms after checkout"); queued++ }
    / texted /    { n = field("order #[0-9]+"); ms = field("[0-9]+ ms after checkout"); sent[n]++
                    if (!(n in due)) { print "FAIL: order #" n " texted but never queued"; bad++ }
                    else if (ms < due[n]) { print "FAIL: order #" n " texted " ms " ms after checkout, due at " due[n]; bad++ }
                    texts++ }
    END {
        for (n in due) if (!(n in sent)) { print "FAIL: order #" n " was queued and never texted"; bad++ }
        if (queued == 0) { print "FAIL: nothing queued"; bad++ }
        if (run1 < 3 || crashed != 1) { print "FAIL: run 1 did not crash after its 3rd text"; bad++ }
        if (again < 1) { print "FAIL: run 2 did not send again the text whose ack the kill lost"; bad++ }
        if (bad) exit 1
        printf "ok: %d texts queued, %d sent (%d of them again after the kill), none lost, none early\n",
               queued, texts, texts - queued
    }'

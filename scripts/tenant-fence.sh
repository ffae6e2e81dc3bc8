#!/usr/bin/env bash
# docs/tenants.md, "The fence's cost": how long `denorm rebuild --tenant`
# fences the live workers off a tenant's own indexes, under live traffic,
# on noida-db and tansu. Tenant acme (dedicated) and globex (shared) each
# get FILES files in 4 partitions; a live worker applies them. Then, while
# both tenants' producers send RATE commands/s between them (file upserts,
# every fiftieth a directory's rename), acme is rebuilt alone. Printed: the
# rebuild's length, its fence's (from its log: `fenced_ms`), the live
# worker's "index gone" retries, and the produce -> searchable time of a
# file of each tenant sent before the rebuild and once it has fenced.
# MOVE=1: globex is moved from the shared indexes into its own instead
# (its fence counted from the placement's record).
#   scripts/tenant-fence.sh [FILES [RATE]]   (default 20000; 100)
# KEEP=DIR keeps the worker's and the rebuild's logs there.
set -euo pipefail
cd "$(dirname "$0")/.."
files="${1:-20000}" rate="${2:-100}"
. scripts/lib.sh
measurement_setup
export DENORM_ES_PREFIX=fence DENORM_GROUP=fence DENORM_ES_DEDICATED_TENANTS=acme
"$bin" topics --partitions 4 >/dev/null
python3 -c "
import json
for t in ('acme', 'globex'):
    for i in range($files):
        print(json.dumps({'op': 'upsert_file', 'tenant': t, 'id': f'f{i}', 'path': f'/d{i % 8}/s{i % 40}/f{i}.txt', 'contents': 'x'}))
" > "$state/files.jsonl"
"$bin" run --partitions 4 --metrics-addr 127.0.0.1:0 > "$state/worker.log" 2>&1 &
worker=$!
pids="$pids $worker"
"$bin" produce --jsonl "$state/files.jsonl" >/dev/null
until "$bin" lag --json 2>/dev/null | grep -q '"total":0,'; do
  kill -0 "$worker" 2>/dev/null || { echo "the worker exited:" >&2; cat "$state/worker.log" >&2; exit 1; }
  sleep 0.5
done

# Live traffic: every half second, RATE/2 commands of both tenants.
(
  n=0
  while :; do
    python3 -c "
import json
for i in range($rate // 2):
    t = ('acme', 'globex')[($n + i) % 2]
    k = $n * 1000 + i
    if i % 50 == 49:
        print(json.dumps({'op': 'rename', 'tenant': t, 'from': f'/d{k % 8}/s{k % 40}', 'to': f'/d{k % 8}/r{k}'}))
    else:
        print(json.dumps({'op': 'upsert_file', 'tenant': t, 'id': f'live{k}', 'path': f'/d{k % 8}/live/f{k}.txt', 'contents': 'y'}))
" > "$state/live.jsonl"
    "$bin" produce --jsonl "$state/live.jsonl" >/dev/null 2>&1 || true
    n=$((n + 1))
    sleep 0.5
  done
) &
traffic=$!
pids="$pids $traffic"

# probe TENANT NAME: one file of TENANT; its produce -> searchable time,
# in seconds, goes to $state/probe-NAME.
probe() {
  local tenant="$1" name="$2" start
  start=$(date +%s.%N)
  "$bin" produce --tenant "$tenant" upsert-file --id "$name" --path "/probe/$name.txt" --contents z >/dev/null
  until "$bin" search files --tenant "$tenant" --under /probe --limit 10 2>/dev/null | grep -q "$name"; do sleep 0.05; done
  echo "$(echo "$(date +%s.%N) - $start" | bc)" > "$state/probe-$name"
}
# Under the live traffic, before the rebuild.
sleep 5
probe acme acme-before & a=$!
probe globex globex-before & g=$!
wait "$a" "$g"
# Once the rebuild has fenced.
fenced_probe() {
  until grep -q "fenced off" "$state/rebuild.log" 2>/dev/null; do sleep 0.05; done
  probe "$1" "$1-fenced"
}
fenced_probe acme & probe_acme=$!
fenced_probe globex & probe_globex=$!
start=$(date +%s.%N)
if [ -n "${MOVE:-}" ]; then
  what="a move of globex into its own indexes"
  DENORM_ES_DEDICATED_TENANTS=acme,globex "$bin" rebuild --tenant globex --metrics-addr 127.0.0.1:0 > "$state/rebuild.log" 2>&1
else
  what="rebuild --tenant acme"
  "$bin" rebuild --tenant acme --metrics-addr 127.0.0.1:0 > "$state/rebuild.log" 2>&1
fi
took=$(echo "$(date +%s.%N) - $start" | bc)
wait "$probe_acme" "$probe_globex"
kill "$traffic"; wait "$traffic" 2>/dev/null || true
fenced=$(grep -o 'fenced_ms=[0-9]*' "$state/rebuild.log" | cut -d= -f2)
gone=$(grep -c "index gone" "$state/worker.log" || true)
[ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$state"/*.log "$KEEP"/
echo "$what of $files files, live traffic $rate commands/s of both tenants:"
echo "  rebuild ${took:0:5} s; fenced ${fenced:-?} ms; live worker's 'index gone' lines: $gone"
for p in before fenced; do
  printf '  sent %-7s produce -> searchable: acme %5.2f s, globex %5.2f s\n' "$p:" "$(cat "$state/probe-acme-$p")" "$(cat "$state/probe-globex-$p")"
done

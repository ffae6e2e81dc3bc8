#!/usr/bin/env bash
# Review F11 of Elasticsearch (docs/elasticsearch.md, "Under replay
# load"): the fan-outs a worker runs at once in key lanes, each holding a
# point in time, with --max-lane-fan-outs unbounded (32, the default) and
# bounded. Four trees of one partition are renamed at once on noida-db;
# the worker's `denorm_lane_fan_outs` gauge is sampled every 20 ms (each
# rename within its tree: a fan-out of its own).
#   scripts/lane-fan-outs.sh [BOUND [FILES_PER_TREE]]   (default 2; 3000)
set -euo pipefail
cd "$(dirname "$0")/.."
bound="${1:-2}" files="${2:-3000}"
. scripts/lib.sh
measurement_setup
es="$DENORM_INDEX"
port=$((20000 + RANDOM % 20000))
"$bin" topics --partitions 1 >/dev/null
python3 -c "
import json
for t in range(4):
    for i in range($files):
        print(json.dumps({'op': 'upsert_file', 'id': f't{t}-{i}', 'path': f'/t{t}/a/d{i % 50}/f{i}.txt', 'contents': 'x'}))
" > "$state/files.jsonl"
for round in 32 "$bound"; do
  export DENORM_ES_PREFIX="l$round" DENORM_GROUP="lanes-$round"
  "$bin" run --partitions 1 --max-lane-fan-outs "$round" --page-size 250 --fan-out-page-pause-ms 100 \
    --metrics-addr "127.0.0.1:$port" > "$state/worker-$round.log" 2>&1 &
  worker=$!
  pids="$pids $worker"
  "$bin" produce --jsonl "$state/files.jsonl" >/dev/null
  until "$bin" lag --json 2>/dev/null | grep -q '"total":0,'; do sleep 0.5; done
  for t in 0 1 2 3; do "$bin" produce rename --from "/t$t/a" --to "/t$t/moved" >/dev/null 2>&1; done
  peak=0
  start=$(date +%s.%N)
  while ! "$bin" lag --json 2>/dev/null | grep -q '"total":0,'; do
    now=$(curl -s "127.0.0.1:$port/metrics" | awk '/^denorm_lane_fan_outs /{print int($2)}')
    [ "${now:-0}" -gt "$peak" ] && peak=$now
    sleep 0.02
  done
  took=$(echo "$(date +%s.%N) - $start" | bc)
  moved=0
  for t in 0 1 2 3; do moved=$((moved + $("$bin" search files --under "/t$t/moved" --limit 0 | wc -l))); done
  kill -TERM "$worker"; wait "$worker" || true
  echo "--max-lane-fan-outs $round: 4 renames of $files files in one partition; at most $peak fan-outs in lanes at once (each with its point in time); ${took:0:5} s; $moved files counted under the new names"
  port=$((port + 1))
done

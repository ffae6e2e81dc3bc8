#!/usr/bin/env bash
# Review F12 of Elasticsearch (docs/elasticsearch.md, "The meta index's
# primary shards"): how the workers' meta writes (every commit's
# checkpoint) land on the meta index's shards, with one primary and with
# DENORM_ES_META_SHARDS=N. One worker applies the same 12-partition log
# into a noida-db for each, and the meta index's indexing operations are
# read per shard (`_stats/indexing?level=shards`).
#   scripts/meta-shards.sh [SHARDS [FILES USERS POSTS]]   (default 4; 8000 800 4000)
set -euo pipefail
cd "$(dirname "$0")/.."
shards="${1:-4}" files="${2:-8000}" users="${3:-800}" posts="${4:-4000}"
. scripts/lib.sh
measurement_setup
es="$DENORM_INDEX"
"$bin" topics --partitions 12 >/dev/null
"$bin" generate --files "$files" --users "$users" --posts "$posts" --renamed-users $((users / 2)) > "$state/data.jsonl"
"$bin" produce --jsonl "$state/data.jsonl" >/dev/null
echo "$(wc -l < "$state/data.jsonl") commands in 12 partitions" >&2
for n in 1 "$shards"; do
  export DENORM_ES_PREFIX="m$n" DENORM_ES_META_SHARDS="$n" DENORM_GROUP="meta-$n"
  start=$(date +%s.%N)
  "$bin" run --partitions 12 > "$state/worker-$n.log" 2>&1 &
  worker=$!
  pids="$pids $worker"
  until "$bin" lag --json 2>/dev/null | grep -q '"total":0,'; do sleep 1; done
  took=$(echo "$(date +%s.%N) - $start" | bc)
  kill -TERM "$worker"; wait "$worker" || true
  curl -s "$es/m$n-meta/_stats/indexing?level=shards" | python3 -c "
import json, sys
d = json.load(sys.stdin)
shards = d['indices']['m$n-meta']['shards']
ops = sorted((int(k), sum(c['indexing']['index_total'] for c in v if c.get('routing', {}).get('primary', True))) for k, v in shards.items())
total = sum(o for _, o in ops)
print(f'meta shards {len(ops)}: {total} meta writes in ${took:0:5} s; per shard ' + ', '.join(str(o) for _, o in ops) + f'; busiest shard {max(o for _, o in ops) / total:.0%} of them')
"
done

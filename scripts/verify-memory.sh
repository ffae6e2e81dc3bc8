#!/usr/bin/env bash
# Review S1 of verify (docs/verify.md, "Limits"): a whole verify of a
# 12-partition index with the chart CronJob's settings (16 MiB of indexing
# memory per partition) inside a memory cgroup limited to 512 MiB, as the
# CronJob's container is. Needs root and cgroup v1's memory controller.
#   scripts/verify-memory.sh [FILES USERS POSTS]   (default 600000 20000 200000)
set -euo pipefail
cd "$(dirname "$0")/.."
files="${1:-600000}" users="${2:-20000}" posts="${3:-200000}"
. scripts/lib.sh
bin="$(release_binary)"
state="$(mktemp -d)"
cg=/sys/fs/cgroup/memory/denorm-verify-$$
trap 'scripts/broker.sh stop "$state/broker" || true; rmdir "$cg" 2>/dev/null || true; rm -rf "$state"' EXIT
mkdir -p "$state/broker" "$state/scratch"
DENORM_BROKERS="$(scripts/broker.sh start "$state/broker")"
export DENORM_BROKERS DENORM_INDEX="$state/index"
"$bin" topics --partitions 12 >/dev/null
"$bin" generate --files "$files" --users "$users" --posts "$posts" > "$state/data.jsonl"
"$bin" produce --jsonl "$state/data.jsonl" >/dev/null
"$bin" run --partitions 12 > "$state/worker.log" 2>&1 &
worker=$!
until "$bin" lag --json 2>/dev/null | grep -q '"total":0,'; do sleep 2; done
kill -TERM "$worker"; wait "$worker" || true
echo "index: $(du -sh "$state/index" | cut -f1), $(wc -l < "$state/data.jsonl") commands" >&2
mkdir "$cg"
echo $((512 << 20)) > "$cg/memory.limit_in_bytes"
rc=0
( echo "$BASHPID" > "$cg/cgroup.procs"; exec /usr/bin/time -v "$bin" verify --index-memory-mb 16 --scratch-dir "$state/scratch" --timeout-secs 3000 ) \
  > "$state/verify.out" 2> "$state/verify.err" || rc=$?
tail -2 "$state/verify.out"
grep -E "Maximum resident|Elapsed" "$state/verify.err"
echo "verify exit $rc; cgroup peak $(( $(cat "$cg/memory.max_usage_in_bytes") >> 20 )) MiB of 512, failed charges $(cat "$cg/memory.failcnt"), $(grep oom_kill "$cg/memory.oom_control" | tr '\n' ' ')"

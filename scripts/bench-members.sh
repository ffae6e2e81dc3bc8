#!/usr/bin/env bash
# `denorm rebuild` and `denorm verify` as N processes (--members N), timed
# for N = 1, 2, 4 on one private tansu broker (docs/benchmark.md, "Rebuild
# and verify across processes"). The log is the demo's generator: files,
# users, posts, then renamed users (profile changes), as producers write
# them; a live worker applies it first, then each rebuild replays it whole
# and each verify replays it into a scratch copy and compares.
#   scripts/bench-members.sh [--on-noida] [generate flags, e.g. --files 50000]
# Every process runs on this machine: the members share its cores, the
# broker's and (with --on-noida) the Elasticsearch-API server's.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-tansu.sh >/dev/null
cargo build --release --quiet
denorm="${CARGO_TARGET_DIR:-target}/release/denorm"
state="$(mktemp -d)"
trap 'scripts/broker.sh stop "$state"; scripts/elastic.sh stop "$state/es"; [ -n "${KEEP:-}" ] && echo "kept $state" >&2 || rm -rf "$state"' EXIT
brokers="$(scripts/broker.sh start "$state")"
index="$state/index"
if [ "${1:-}" = --on-noida ]; then
  shift
  scripts/install-noida.sh >/dev/null
  index="$(scripts/elastic.sh start "$state/es")"
fi
partitions="${PARTITIONS:-8}"
args=(--brokers "$brokers" --topic bench-members --group bench-members --partitions "$partitions" --index "$index")
[ $# -gt 0 ] || set -- --files 40000 --users 4000 --posts 20000 --renamed-users 2000
"$denorm" generate "$@" >"$state/log.jsonl"
commands="$(wc -l <"$state/log.jsonl")"
echo "log: $commands commands (files, users, posts, renamed users) on $partitions partitions; index $index" >&2
"$denorm" "${args[@]}" run --metrics-addr 127.0.0.1:0 >"$state/run.log" 2>&1 &
worker=$!
"$denorm" "${args[@]}" produce --jsonl "$state/log.jsonl" --wait 1800 >/dev/null
kill -TERM "$worker"
wait "$worker" || true

# Runs `$1` members of `denorm $2 ...` at once; prints the seconds until
# the last one exits.
members() {
  local n="$1" what="$2"
  shift 2
  local start pids=() i
  start="$(date +%s.%N)"
  for ((i = 0; i < n; i++)); do
    "$denorm" "${args[@]}" "$what" "$@" --members "$n" --member "$i" >"$state/$what-$n-$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    wait "$p" || { rc=$?; [ "$what" = verify ] && [ "$rc" = 1 ] || { echo "a member of $what failed ($rc): see below" >&2; cat "$state/$what-$n"-*.log >&2; exit 1; }; }
  done
  echo "$(date +%s.%N) - $start" | bc
}

# Seconds between the first line of the member logs $1 matching $2 and the
# last one matching $3 (their timestamps).
between() {
  local from to
  from="$(grep -h "$2" $1 | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-27 | sort | head -1)"
  to="$(grep -h "$3" $1 | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-27 | sort | tail -1)"
  echo "$(date -d "$to" +%s.%N) - $(date -d "$from" +%s.%N)" | bc
}

printf '%-8s %8s %10s %12s %22s\n' what members seconds commands/s "of which building (s)"
for n in 1 2 4; do
  secs="$(members "$n" rebuild --metrics-addr 127.0.0.1:0)"
  build="$(between "$state/rebuild-$n-*.log" "partitions assigned" "every partition has caught up")"
  printf '%-8s %8d %10.1f %12.0f %22.1f\n' rebuild "$n" "$secs" "$(echo "$commands / $secs" | bc -l)" "$build"
done
for n in 1 2 4; do
  mkdir -p "$state/scratch"
  secs="$(members "$n" verify --run "bench-$n")"
  printf '%-8s %8d %10.1f %12.0f\n' verify "$n" "$secs" "$(echo "$commands / $secs" | bc -l)"
done
echo "(building: from the first assignment to the stop; before it, the group's forming: tansu answers a group of several members after its rebalance wait)"
echo "(the members share this machine's $(nproc) cores with the broker$([ "$index" = "$state/index" ] || echo ' and the Elasticsearch-API server'))"

#!/usr/bin/env bash
# The benchmark (docs/benchmark.md): builds denorm, starts a private tansu
# broker (installed once per machine, like the test suite's), runs
# `denorm bench` against it, prints the table and writes bench.json.
# Extra arguments go to `denorm bench`, e.g. `--docs 20000 --renames 10000`
# for a quick run, or `--worker-arg=--commit-quiet-ms=0` to try a worker flag.
# `--on-noida` first: the Elasticsearch phases against a private noida-db
# (the test suite's Elasticsearch-API server), as `--elasticsearch URL`
# does against a cluster of yours.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-tansu.sh >/dev/null
cargo build --release --quiet
state="$(mktemp -d)"
trap 'scripts/broker.sh stop "$state"; scripts/elastic.sh stop "$state/es"; rm -rf "$state"' EXIT
brokers="$(scripts/broker.sh start "$state")"
echo "broker: tansu at $brokers (sqlite storage in $state)" >&2
if [ "${1:-}" = --on-noida ]; then
  shift
  scripts/install-noida.sh >/dev/null
  es="$(scripts/elastic.sh start "$state/es")"
  echo "elasticsearch: noida-db at $es (data in $state/es)" >&2
  set -- --elasticsearch "$es" "$@"
fi
"${CARGO_TARGET_DIR:-target}/release/denorm" --brokers "$brokers" bench --broker-pid "$(cat "$state/pid")" "$@"

#!/usr/bin/env bash
# Start or stop noida-db's Elasticsearch API (an independent server, see
# scripts/install-noida.sh) on a free loopback port, its data in DIR/data.
#   scripts/elastic.sh start DIR  -> prints http://127.0.0.1:port (also in DIR/address); state (pid, log) in DIR
#   scripts/elastic.sh stop DIR
set -euo pipefail
. "$(dirname "$0")/lib.sh"
noida="$("$(dirname "$0")/install-noida.sh")"
launch() {
  mkdir -p "$1/data"
  # It prints a glibc version warning at every start, and runs.
  exec "$noida" start --only elasticsearch --host 127.0.0.1 --elasticsearch-port "$2" --data-dir "$1/data"
}
address() { echo "http://127.0.0.1:$1"; }
service_main noida-db "$@"

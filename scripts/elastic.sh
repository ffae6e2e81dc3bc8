#!/usr/bin/env bash
# Start or stop noida-db's Elasticsearch API (an independent server, see
# scripts/install-noida.sh) on a free loopback port, its data in DIR.
#   scripts/elastic.sh start DIR  -> prints http://127.0.0.1:port; state (pid, log, data) in DIR
#   scripts/elastic.sh stop DIR
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cmd="${1:-}"; dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
case "$cmd" in
  start)
    noida="$("$(dirname "$0")/install-noida.sh")"
    mkdir -p "$dir/data"
    dir="$(cd "$dir" && pwd)"
    port="$(free_port)"
    # It prints a glibc version warning at every start, and runs.
    "$noida" start --only elasticsearch --host 127.0.0.1 --elasticsearch-port "$port" \
      --data-dir "$dir/data" >"$dir/server.log" 2>&1 &
    echo $! >"$dir/pid"
    wait_listening noida-db "$dir" "$port"
    echo "http://127.0.0.1:$port" >"$dir/url"
    echo "http://127.0.0.1:$port"
    ;;
  stop) stop_server "$dir" ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Start or stop a tansu broker on a free loopback port with SQLite storage.
#   scripts/broker.sh start DIR   -> prints host:port; state (pid, port, db, log) in DIR
#   scripts/broker.sh stop DIR
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cmd="${1:-}"; dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
case "$cmd" in
  start)
    tansu="$("$(dirname "$0")/install-tansu.sh")"
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    port="$(free_port)"
    url="tcp://127.0.0.1:$port"
    # tansu reads some settings from the environment: make ours win.
    # tansu resolves the sqlite:// path against its working directory.
    (cd "$dir" && exec env -u LISTENER_URL -u ADVERTISED_LISTENER_URL -u STORAGE_ENGINE \
      "$tansu" broker --listener-url "$url" --advertised-listener-url "$url" \
      --storage-engine "sqlite://broker.db" >server.log 2>&1) &
    echo $! >"$dir/pid"
    wait_listening tansu "$dir" "$port"
    echo "127.0.0.1:$port" >"$dir/brokers"
    echo "127.0.0.1:$port"
    ;;
  stop) stop_server "$dir" ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Start or stop a tansu broker on a free loopback port with SQLite storage.
#   scripts/broker.sh start DIR   -> prints host:port; state (pid, port, db, log) in DIR
#   scripts/broker.sh stop DIR
set -euo pipefail
cmd="${1:-}"; dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
case "$cmd" in
  start)
    tansu="$("$(dirname "$0")/install-tansu.sh")"
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    url="tcp://127.0.0.1:$port"
    # tansu reads some settings from the environment: make ours win.
    # tansu resolves the sqlite:// path against its working directory.
    (cd "$dir" && exec env -u LISTENER_URL -u ADVERTISED_LISTENER_URL -u STORAGE_ENGINE \
      "$tansu" broker --listener-url "$url" --advertised-listener-url "$url" \
      --storage-engine "sqlite://broker.db" >broker.log 2>&1) &
    echo $! >"$dir/pid"
    for _ in $(seq 1 300); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "127.0.0.1:$port" >"$dir/brokers"
        echo "127.0.0.1:$port"
        exit 0
      fi
      kill -0 "$(cat "$dir/pid")" 2>/dev/null || { echo "tansu exited:" >&2; cat "$dir/broker.log" >&2; exit 1; }
      sleep 0.1
    done
    echo "tansu did not start listening on port $port" >&2; exit 1
    ;;
  stop)
    dir="$(cd "$dir" 2>/dev/null && pwd || echo "$dir")"
    if [ -f "$dir/pid" ]; then
      pid="$(cat "$dir/pid")"
      kill "$pid" 2>/dev/null || true
      # tansu may not act on SIGTERM while busy: insist after 5 s.
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/pid"
    fi
    ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac

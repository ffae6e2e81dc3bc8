#!/usr/bin/env bash
# Start or stop a tansu broker on a free loopback port with SQLite storage.
#   scripts/broker.sh start DIR   -> prints host:port (also in DIR/address); state (pid, db, log) in DIR
#   scripts/broker.sh stop DIR
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tansu="$("$(dirname "$0")/install-tansu.sh")"
launch() {
  local url="tcp://127.0.0.1:$2"
  # tansu reads some settings from the environment: make ours win.
  # tansu resolves the sqlite:// path against its working directory.
  cd "$1" && exec env -u LISTENER_URL -u ADVERTISED_LISTENER_URL -u STORAGE_ENGINE \
    "$tansu" broker --listener-url "$url" --advertised-listener-url "$url" --storage-engine "sqlite://broker.db"
}
address() { echo "127.0.0.1:$1"; }
service_main tansu "$@"

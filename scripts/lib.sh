# Shared by scripts/broker.sh and scripts/elastic.sh: a free loopback port,
# waiting until a started server listens, and stopping it; and by the
# measurement scripts: the release binary, and a broker and a noida-db of
# their own.

# A free TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_listening NAME DIR PORT: waits (30 s at most) until 127.0.0.1:PORT
# accepts connections while the process in DIR/pid runs; on failure prints
# DIR/server.log and returns 1.
wait_listening() {
  local name="$1" dir="$2" port="$3"
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      echo "$name exited:" >&2; cat "$dir/server.log" >&2; return 1
    fi
    sleep 0.1
  done
  echo "$name did not start listening on port $port" >&2; cat "$dir/server.log" >&2; return 1
}

# stop_server DIR: SIGTERM to the process in DIR/pid, SIGKILL after 5 s.
stop_server() {
  local dir pid
  dir="$(cd "$1" 2>/dev/null && pwd || echo "$1")"
  [ -f "$dir/pid" ] || return 0
  pid="$(cat "$dir/pid")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/pid"
}

# service_main NAME start|stop DIR: the command line of a script that
# defines `launch DIR PORT` (execs the server; its output goes to
# DIR/server.log) and `address PORT` (prints what clients connect to).
# start prints the address and keeps it in DIR/address; stop stops it.
service_main() {
  local name="$1" cmd="${2:-}" dir="${3:-}" port
  [ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
  case "$cmd" in
    start)
      mkdir -p "$dir"
      dir="$(cd "$dir" && pwd)"
      port="$(free_port)"
      launch "$dir" "$port" >"$dir/server.log" 2>&1 &
      echo $! >"$dir/pid"
      wait_listening "$name" "$dir" "$port"
      address "$port" | tee "$dir/address"
      ;;
    stop) stop_server "$dir" ;;
    *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
  esac
}

# release_binary: builds denorm (release, shipped features) and prints the
# binary's path, under CARGO_TARGET_DIR when set (relative or absolute).
release_binary() {
  cargo build --release --quiet >&2
  local target="${CARGO_TARGET_DIR:-target}"
  case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
  echo "$target/release/denorm"
}

# servers_in STATE: starts a tansu broker and a noida-db under STATE and
# exports DENORM_BROKERS and DENORM_INDEX (the noida-db's URL); the caller
# stops both with stop_servers_in STATE.
servers_in() {
  mkdir -p "$1/broker"
  DENORM_BROKERS="$(scripts/broker.sh start "$1/broker")"
  DENORM_INDEX="$(scripts/elastic.sh start "$1/es")"
  export DENORM_BROKERS DENORM_INDEX
}

stop_servers_in() {
  scripts/broker.sh stop "$1/broker" || true
  scripts/elastic.sh stop "$1/es" || true
}

# measurement_setup: what the measurement scripts start from. Builds the
# release binary ($bin), makes a state directory ($state), starts a broker
# and a noida-db in it (servers_in), and on exit kills the processes whose
# ids the caller adds to $pids, stops both servers and removes $state.
measurement_setup() {
  bin="$(release_binary)"
  state="$(mktemp -d)"
  pids=""
  trap 'kill $pids 2>/dev/null || true; stop_servers_in "$state"; rm -rf "$state"' EXIT
  servers_in "$state"
}

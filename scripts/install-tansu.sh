#!/usr/bin/env bash
# Install the tansu Kafka-protocol broker once per machine, cached outside the
# repository (default: $HOME/.cache/denorm/tansu). Prints the binary's path.
# With --cached, only prints it when it is installed already (exit 1 if not).
set -euo pipefail
TANSU_VERSION="${TANSU_VERSION:-0.6.0}"
ROOT="${DENORM_TANSU_ROOT:-$HOME/.cache/denorm/tansu-$TANSU_VERSION}"
BIN="$ROOT/bin/tansu"
if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi
# --cached: only say where it is, if it is installed (exit 1 if not).
if [ "${1:-}" = "--cached" ]; then
  exit 1
fi
echo "installing tansu $TANSU_VERSION into $ROOT (one-time build, about 15 minutes)" >&2
cargo install tansu --version "$TANSU_VERSION" --locked --features libsql --root "$ROOT" >&2
echo "$BIN"

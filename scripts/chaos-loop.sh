#!/usr/bin/env bash
# scripts/chaos-loop.sh RUNS [DIR] [TEST]: runs one integration test (the
# chaos test by default) RUNS times in a row, each with a seed of its own
# and a fresh directory under DIR (default: the system's temporary
# directory; /dev/shm for tmpfs, a disk path for the disk). The binaries are
# copied first, so the tree can be rebuilt meanwhile. Each line of
# $DENORM_LOOP_OUT/summary.txt (default test-artifacts/loop-<time>) gives a
# run's exit status, duration and seed; a failed run keeps its output and
# its failure report (tests/it/common/forensics.rs) there.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:?usage: scripts/chaos-loop.sh RUNS [DIR] [TEST]}"
base="${2:-${TMPDIR:-/tmp}}"
test="${3:-chaos::chaos_kills_and_rebalances_lose_nothing_and_break_no_order}"
out="${DENORM_LOOP_OUT:-$PWD/test-artifacts/loop-$(date +%Y%m%d-%H%M%S)}"
target="${CARGO_TARGET_DIR:-target}"
: "${DENORM_TANSU:?set DENORM_TANSU to a tansu 0.6 binary (scripts/install-tansu.sh)}"
cargo build --release --features failpoints --quiet --bin denorm
bin="$(cargo nextest list --release --features failpoints --message-format json 2>/dev/null \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); print(next(b["binary-path"] for b in d["rust-suites"].values() if b["binary-name"]=="it"))')"
copy="$(mktemp -d)"
cp "$target/release/denorm" "$copy/denorm"
cp "$bin" "$copy/it"
mkdir -p "$out"
touch "$out/summary.txt"
export DENORM_TEST_BIN="$copy/denorm" DENORM_TEST_ARTIFACTS="$out/artifacts" DENORM_TANSU
echo "looping $test $runs times under $base; summary in $out/summary.txt" >&2
for i in $(seq 1 "$runs"); do
  dir="$(mktemp -d "$base/denorm-loop.XXXXXX")"
  start=$(date +%s)
  rc=0
  TMPDIR="$dir" "$copy/it" "$test" --exact --nocapture >"$out/run-$i.log" 2>&1 || rc=$?
  seed="$(grep -o 'seed: [0-9]*' "$out/run-$i.log" | head -1 || true)"
  echo "$i rc=$rc $(( $(date +%s) - start ))s $seed" >>"$out/summary.txt"
  [ "$rc" = 0 ] && rm -f "$out/run-$i.log"
  # A failed run's brokers (their working directories lie under $dir).
  for p in /proc/[0-9]*; do
    case "$(readlink "$p/cwd" 2>/dev/null)" in "$dir"*) kill -9 "${p#/proc/}" 2>/dev/null || true ;; esac
  done
  rm -rf "$dir"
done
rm -rf "$copy"
awk '{ split($2, r, "="); if (r[2] != 0) f++ } END { printf "%d runs, %d failed\n", NR, f }' "$out/summary.txt"

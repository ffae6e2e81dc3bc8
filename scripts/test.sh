#!/usr/bin/env bash
# The whole test suite: installs what it needs once per machine, cached
# under $HOME/.cache/denorm (the tansu broker; fastavro, aiokafka, avsc,
# kafkajs, smol-toml and Java's Avro for the interop tests; helm-python-sdk,
# kubernetes-validate and checkov for the chart; noida-db, an independent
# Elasticsearch-API server), starts one Elasticsearch-API server for the
# run (each test starts a tansu of its own), and runs every test with
# cargo-nextest. Extra arguments go to nextest.
#
# --extended (first argument) also runs, after the suite, every ignored
# test (the seventeen other consistency seeds and the suite's seeds on
# Elasticsearch) and fuzzes each fuzz target for DENORM_FUZZ_SECONDS
# (default 300) with scripts/fuzz.sh (docs/development.md says when).
#
# Under CI (CI set) the cargo build cache is kept under the same cache
# directory, so that a fresh clone compiles only denorm itself; a
# CARGO_TARGET_DIR given by the caller wins. At the end it prints the time
# of each phase.
set -euo pipefail
cd "$(dirname "$0")/.."
extended=0
if [ "${1:-}" = "--extended" ]; then
  extended=1
  shift
fi
start=$(date +%s)
phases=()
phase_start=$start
# phase NAME: records the time since the previous phase ended.
phase() {
  local now
  now=$(date +%s)
  phases+=("$(printf '%-28s %5ss' "$1" "$((now - phase_start))")")
  phase_start=$now
}
report() {
  echo "time per phase:" >&2
  for p in "${phases[@]}"; do echo "  $p" >&2; done
  echo "test suite finished in $(( $(date +%s) - start ))s" >&2
}
if [ -n "${CI:-}" ] && [ -z "${CARGO_TARGET_DIR:-}" ]; then
  CARGO_TARGET_DIR="$HOME/.cache/denorm/cargo-target"
  export CARGO_TARGET_DIR
  echo "cargo build cache: $CARGO_TARGET_DIR" >&2
fi
target="${CARGO_TARGET_DIR:-target}"
if ! command -v cargo-nextest >/dev/null 2>&1; then
  echo "installing cargo-nextest" >&2
  cargo install cargo-nextest --locked
fi
# tansu's one-time build (about ten minutes on two cores) runs beside the
# checks and builds below, which leave the cores idle at times (linking,
# single-threaded crates); waited for before the first test needs it.
tansu_job=""
tansu_out="$(mktemp)"
tansu_log="$(mktemp)"
if ! scripts/install-tansu.sh --cached >"$tansu_out" 2>/dev/null; then
  echo "building tansu in the background (log: $tansu_log)" >&2
  scripts/install-tansu.sh >"$tansu_out" 2>"$tansu_log" &
  tansu_job=$!
fi
if ! command -v promtool >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing promtool (Debian package prometheus) for the metrics format check" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null) \
    || echo "promtool unavailable: the metrics test falls back to its own format checks" >&2
fi
# Formatting (rustfmt.toml): checked first, it takes a second.
if ! cargo fmt --version >/dev/null 2>&1 && command -v rustup >/dev/null 2>&1; then
  rustup component add rustfmt >&2 || true
fi
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --check || { echo "cargo fmt --check: the code is not formatted (run cargo fmt)" >&2; exit 1; }
  echo "cargo fmt --check: formatted"
else
  echo "rustfmt unavailable: the formatting check is skipped" >&2
fi
# Clippy, warnings as errors, on every target (the library, the binary,
# the tests, the examples and benchmarks), with the test features and
# with the shipped feature set (issue 46).
if ! cargo clippy --version >/dev/null 2>&1 && command -v rustup >/dev/null 2>&1; then
  rustup component add clippy >&2 || true
fi
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --release --quiet --all-targets --features failpoints -- -D warnings
  cargo clippy --release --quiet --all-targets -- -D warnings
  echo "cargo clippy -D warnings: clean, with and without the test features"
else
  echo "clippy unavailable: the lint check is skipped" >&2
fi
phase "formatting and clippy"
python3 scripts/check-compose.py
if command -v promtool >/dev/null 2>&1; then
  promtool check config deploy/prometheus.yml >/dev/null
  echo "deploy/prometheus.yml: promtool check config OK"
fi
phase "compose and promtool checks"
scripts/install-noida.sh >/dev/null
DENORM_INTEROP="$(scripts/install-interop.sh)"
export DENORM_INTEROP
phase "noida-db and interop tools"
# The run's files (each test's temporary directory, its tansu's SQLite
# database, noida-db's data) go to a memory file system when the machine
# has one with room (DENORM_TEST_TMP names another directory; "disk"
# keeps the system's temporary directory). On this project's 2-core VM a
# test that commits the embedded index thousands of times took 10-13 s on
# the disk, most of it in fdatasync and the file system's journal, and
# 3.7 s on /dev/shm (docs/development.md). The tests do not depend on the
# disk: a worker killed with kill -9 leaves its files in the page cache
# either way.
test_tmp="${DENORM_TEST_TMP:-}"
if [ -z "$test_tmp" ] && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] \
  && [ "$(df -P -k /dev/shm 2>/dev/null | awk 'NR==2 { print $4 }')" -ge $((8 * 1024 * 1024)) ] 2>/dev/null; then
  test_tmp=/dev/shm
fi
if [ -n "$test_tmp" ] && [ "$test_tmp" != disk ]; then
  state="$(mktemp -d "$test_tmp/denorm-test.XXXXXX")"
else
  state="$(mktemp -d)"
fi
echo "the tests' files: $state" >&2
# What a failed test of the running system leaves (its report, every
# worker's log, the dead letters; tests/it/common/forensics.rs): kept after
# the run, unlike the tests' files.
DENORM_TEST_ARTIFACTS="${DENORM_TEST_ARTIFACTS:-$PWD/test-artifacts}"
export DENORM_TEST_ARTIFACTS
mkdir -p "$state/tmp"
# stop_private_brokers: a test stops its own tansu when it ends; one whose
# test process was killed is stopped here (its working directory lies
# under $state/tmp, the tests' TMPDIR).
stop_private_brokers() {
  local p
  for p in /proc/[0-9]*; do
    case "$(readlink "$p/cwd" 2>/dev/null)" in "$state/tmp"/*) kill -9 "${p#/proc/}" 2>/dev/null || true ;; esac
  done
}
trap 'stop_private_brokers; scripts/elastic.sh stop "$state/es"; rm -rf "$state"' EXIT
# Every Elasticsearch test runs against it, each under an index prefix of
# its own (tests/it/common/elastic.rs). A DENORM_ES_URL given by the caller (a
# real cluster, credentials in DENORM_ES_*) is used instead.
if [ -z "${DENORM_ES_URL:-}" ]; then
  DENORM_ES_URL="$(scripts/elastic.sh start "$state/es")"
  echo "elasticsearch: noida-db at $DENORM_ES_URL (data in $state/es)" >&2
else
  echo "elasticsearch: $DENORM_ES_URL (from DENORM_ES_URL)" >&2
fi
export DENORM_ES_URL
# The Helm chart, offline: Helm v4 lint and render, Kubernetes and CRD
# schemas, checkov, promtool alert tests, env vars against the binary, and
# the embedded values' rendered hook and worker run against a broker of
# their own.
cargo build --release --features failpoints --quiet --bin denorm --example fanout_memory
phase "build the binary and harness"
cargo nextest run --release --features failpoints --no-run
phase "build the tests"
cargo nextest run --features failpoints --lib --no-run
phase "build the debug in-process tests"
if [ -n "$tansu_job" ] && ! wait "$tansu_job"; then
  cat "$tansu_log" >&2
  echo "building tansu failed (above)" >&2
  exit 1
fi
DENORM_TANSU="$(cat "$tansu_out")"
rm -f "$tansu_out" "$tansu_log"
export DENORM_TANSU
phase "tansu (rest of its build)"
chart=0
chart_broker="$(scripts/broker.sh start "$state/kafka")"
DENORM_TEST_BROKERS="$chart_broker" python3 scripts/check-chart.py "$target/release/denorm" || chart=$?
scripts/broker.sh stop "$state/kafka"
phase "chart checks"
# The fan-out memory harness at a smoke size: both backends rename 20,000
# files, and it fails unless every file was rewritten once.
"$target/release/examples/fanout_memory" 2000 20000
phase "fan-out memory harness"
# Every test starts a tansu of its own (tests/it/common/mod.rs, from
# DENORM_TANSU, about 30 ms): tansu 0.6 on SQLite slows as its database
# grows, until one fetch of a long partition holds the broker past the
# groups' session timeouts (docs/development.md). DENORM_TEST_BROKERS set
# by the caller points every test at one broker instead.
tests=0
TMPDIR="$state/tmp" cargo nextest run --release --features failpoints --no-fail-fast "$@" || tests=$?
phase "tests (nextest)"
# The in-process tests again in a debug build, where debug_assert!s run
# (the suite above is a release build; issue 45: an assertion that normal
# operation broke went unseen).
debug=0
TMPDIR="$state/tmp" cargo nextest run --features failpoints --lib --no-fail-fast --no-tests=pass "$@" || debug=$?
phase "in-process tests, debug build"
ignored=0
fuzzed=0
if [ "$extended" = 1 ]; then
  # requested_seeds runs only the seeds its variables ask for.
  TMPDIR="$state/tmp" cargo nextest run --release --features failpoints --no-fail-fast --run-ignored only -E 'not test(/requested_seeds/)' || ignored=$?
  phase "extended: ignored tests"
  # The randomized attempt to fool verify (issue 44): seeds 2 to 11 on each
  # backend (the default run has seed 1).
  DENORM_FOOL_SEED=2 DENORM_FOOL_SEEDS="${DENORM_FOOL_SEEDS:-10}" TMPDIR="$state/tmp" \
    cargo nextest run --release --features failpoints --no-fail-fast -E 'test(/randomized_attempt_to_fool/)' || ignored=$?
  phase "extended: verify_fooled seeds"
  # A declared model's randomized log under kills: seeds 2 to 6 on each
  # backend (the default run has seed 1).
  DENORM_MODEL_CONSISTENCY_SEED=2 DENORM_MODEL_CONSISTENCY_SEEDS="${DENORM_MODEL_CONSISTENCY_SEEDS:-5}" TMPDIR="$state/tmp" \
    cargo nextest run --release --features failpoints --no-fail-fast -E 'test(/^model_consistency::/)' || ignored=$?
  phase "extended: model consistency seeds"
  # The randomized hostile log (in-process): seeds 4 to 43.
  DENORM_HOSTILE_SEEDS="${DENORM_HOSTILE_SEEDS:-40}" TMPDIR="$state/tmp" \
    cargo nextest run --release --features failpoints --no-fail-fast --run-ignored only -E 'test(/hostile_message_dead_lettered_requested_seeds/)' || ignored=$?
  phase "extended: hostile log seeds"
  scripts/fuzz.sh "${DENORM_FUZZ_SECONDS:-300}" || fuzzed=$?
  phase "extended: fuzzing"
fi
report
if [ -d "$DENORM_TEST_ARTIFACTS" ] && [ -n "$(ls -A "$DENORM_TEST_ARTIFACTS")" ]; then
  echo "failure reports of tests (worker logs, dead letters, progress): $DENORM_TEST_ARTIFACTS" >&2
fi
[ "$chart" = 0 ] || echo "the chart checks failed (scripts/check-chart.py, above)" >&2
[ "$debug" = 0 ] || echo "the in-process tests failed in the debug build (above)" >&2
[ "$ignored" = 0 ] || echo "the extended run's ignored tests failed (above)" >&2
[ "$fuzzed" = 0 ] || echo "fuzzing found a crash or could not run (above)" >&2
[ "$chart" = 0 ] && [ "$tests" = 0 ] && [ "$debug" = 0 ] && [ "$ignored" = 0 ] && [ "$fuzzed" = 0 ]

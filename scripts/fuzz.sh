#!/usr/bin/env bash
# Fuzzes each target in fuzz/ for a bounded time (fuzz/README.md): usage
# scripts/fuzz.sh [SECONDS per target, default 300]. Needs the nightly
# toolchain (installed with rustup when missing) and cargo-fuzz (installed
# once under $HOME/.cache/denorm/cargo-fuzz). The seeds come from the
# suite's corpus writer. Exits non-zero when a target finds a crash (its
# input is under fuzz/artifacts/) or when fuzzing cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-300}"
cache="$HOME/.cache/denorm"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "installing the nightly toolchain (cargo-fuzz needs it)" >&2
  rustup toolchain install nightly --profile minimal >&2 || { echo "fuzzing cannot run: no nightly toolchain" >&2; exit 1; }
fi
if [ ! -x "$cache/cargo-fuzz/bin/cargo-fuzz" ]; then
  echo "installing cargo-fuzz under $cache/cargo-fuzz" >&2
  cargo install cargo-fuzz --locked --root "$cache/cargo-fuzz" >&2
fi
export PATH="$cache/cargo-fuzz/bin:$PATH"
corpus="fuzz/corpus/admit"
mkdir -p "$corpus"
DENORM_FUZZ_CORPUS="$PWD/$corpus" cargo test --release --features failpoints --quiet --test it -- --exact cli::write_fuzz_corpus >&2
for target in fuzz/fuzz_targets/*.rs; do
  name="$(basename "$target" .rs)"
  echo "fuzzing $name for ${seconds}s" >&2
  (cd fuzz && cargo +nightly fuzz run "$name" "corpus/$name" -- -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1)
done

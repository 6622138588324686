#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time from the committed seed corpus (copied, so
# the run does not rewrite it). cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP=1 lets the
# stable toolchain build them.
#
#   scripts/fuzz.sh [seconds per target, default 20]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
command -v cargo-fuzz >/dev/null || cargo install -q cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
for target in $(cargo fuzz list); do
  work=$(mktemp -d)
  cp -r "fuzz/corpus/$target/." "$work/"
  echo "+ fuzz $target for ${seconds}s"
  if ! cargo fuzz run "$target" "$work" -- -max_total_time="$seconds" -print_final_stats=1 \
    >"$work.log" 2>&1; then
    tail -n 60 "$work.log"
    echo "fuzz target $target failed; the crashing input is under fuzz/artifacts/$target" >&2
    exit 1
  fi
  grep -E "^stat::number_of_executed_units" "$work.log" || true
  rm -rf "$work" "$work.log"
done

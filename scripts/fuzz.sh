#!/usr/bin/env bash
# Runs every cargo-fuzz target from the committed seed corpus (copied, so a run does not
# rewrite it). cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP=1 lets the stable toolchain
# build them.
#
#   scripts/fuzz.sh                 # CI: a fixed seed and a fixed number of runs per target,
#                                   # so the verdict on a commit is the same on every run
#   scripts/fuzz.sh --random 300    # outside CI: a random seed for 300 s per target, to find
#                                   # new inputs (commit what it finds to fuzz/corpus/<target>)
#
# FUZZ_SEED and FUZZ_RUNS change the CI mode's seed and run count.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "")
    mode=(-seed="${FUZZ_SEED:-20261201}" -runs="${FUZZ_RUNS:-200000}")
    ;;
  --random)
    mode=(-max_total_time="${2:?--random takes a number of seconds}")
    ;;
  *)
    echo "usage: scripts/fuzz.sh [--random SECONDS]" >&2
    exit 2
    ;;
esac
command -v cargo-fuzz >/dev/null || cargo install -q cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
for target in $(cargo fuzz list); do
  work=$(mktemp -d)
  cp -r "fuzz/corpus/$target/." "$work/"
  echo "+ fuzz $target ${mode[*]}"
  if ! cargo fuzz run "$target" "$work" -- "${mode[@]}" -print_final_stats=1 \
    >"$work.log" 2>&1; then
    tail -n 60 "$work.log"
    echo "fuzz target $target failed; the crashing input is under fuzz/artifacts/$target" >&2
    exit 1
  fi
  grep -E "^stat::(number_of_executed_units|new_units_added)" "$work.log" || true
  if [ "${1:-}" = "--random" ]; then
    # Inputs the run found that grow coverage, for the committed corpus.
    new=$(comm -13 <(ls "fuzz/corpus/$target" | sort) <(ls "$work" | sort) | wc -l)
    echo "  $new new corpus inputs (kept in $work)"
    rm -f "$work.log"
  else
    rm -rf "$work" "$work.log"
  fi
done

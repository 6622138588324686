#!/usr/bin/env bash
# Tests the wheel in dist/ as a runtime would get it: installed alone into a fresh venv, for
# every CPython 3.10-3.13 this machine has (pyenv's, and the default python), then the test
# suite run against the installed package, not the source tree. The default interpreter runs
# everything (end-to-end through Mooncake and NIXL, benchmarks as tests, the typing checks);
# the others run tests/ without the engine tests and the typing checks, two files at a time.
#
#   scripts/test_wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$(ls dist/*.whl)
default_version=$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

interpreter() {  # the newest python X.Y on this machine, or nothing
  local version=$1 root
  if [ "$version" = "$default_version" ]; then command -v python; return; fi
  root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  ls -d "$root"/versions/"$version".*/bin/python 2>/dev/null | sort -V | tail -n 1
}

tested=()
for version in 3.10 3.11 3.12 3.13; do
  python=$(interpreter "$version")
  if [ -z "$python" ]; then
    echo "== CPython $version: not installed here, not tested"
    continue
  fi
  venv="$work/py$version"
  "$python" -m venv "$venv"
  if [ "$version" = "$default_version" ]; then
    extras="test,engines"
    # Real vLLM instances run in scripts/test_vllm.sh, in a venv with vLLM.
    args=(-m "not vllm")
  else
    extras="test"
    # One abi3 binary for every version: its stub and the package's types are checked once,
    # on the default interpreter (mypy --strict and stubtest take about 10 s a run).
    # Without the engines, on both cores (a file a worker: some tests count module state).
    args=(tests -m "not mooncake and not nixl and not vllm" --ignore=tests/test_typing.py -n 2 --dist loadfile)
  fi
  echo "== CPython $version ($python): $wheel[$extras]"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "$wheel[$extras]"
  if [ "$version" = "$default_version" ]; then
    # NIXL's wheel declares torch, which host-memory transfers do not need.
    "$venv/bin/python" -m pip install -q --no-deps nixl-cu12
  fi
  # The suite must see the installed wheel (tests/test_api.py checks where pdplan came from).
  PATH="$venv/bin:$PATH" PDPLAN_EXPECT_INSTALLED="$venv" "$venv/bin/python" -m pytest "${args[@]}"
  tested+=("$version")
done
echo "tested the wheel on CPython ${tested[*]}"
case " ${tested[*]} " in
  *" $default_version "*) ;;
  *) echo "the default interpreter was not tested" >&2; exit 1 ;;
esac

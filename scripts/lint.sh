#!/usr/bin/env bash
# Lints the Python side as CI does: ruff's checks and its formatting (installed here, so a fresh
# machine needs nothing beforehand). The Rust side is linted by cargo clippy and cargo fmt.
#
#   scripts/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --root-user-action=ignore "ruff>=0.5"
python -m ruff check .
python -m ruff format --check .

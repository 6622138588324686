"""Benchmarks run as tests too: `pytest` runs each once (timing disabled in pyproject's addopts);
`pytest benches --benchmark-enable` times them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

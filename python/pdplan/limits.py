"""Every bound pdplan puts on what it is given, from the one place the core keeps them.

A value past a bound is refused with `UnsupportedPDLayoutError`, whose message names the
bound (``... (pdplan.limits.MAX_PAGE_SIZE)``). The ``DEFAULT_MAX_*`` values are defaults a
call may raise (``max_payload_bytes=``, ``max_fragments=``); the cache sizes
are the capacities of the process-wide frame caches.
"""

from __future__ import annotations

from pdplan._core import (
    DEFAULT_MAX_FRAGMENTS,
    DEFAULT_MAX_LAYOUT_BYTES,
    DEFAULT_MAX_PAYLOAD_BYTES,
    ENCODE_CACHE_ENTRIES,
    ENCODE_CACHE_ITEMS,
    FRAME_CACHE_BYTES,
    FRAME_CACHE_ENTRIES,
    MAX_ARRAY_AXES,
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_DESCRIPTORS,
    MAX_INTERLEAVE,
    MAX_LAYERS,
    MAX_LAYOUT_BUFFERS,
    MAX_PAGE_SIZE,
    MAX_PARTS,
    MAX_PLAN_FRAGMENTS,
    MAX_ROWS_PER_PAGE,
    MAX_STAGES,
    MAX_TOKENS,
    MAX_VALUE,
    MAX_WORLD_SIZE,
)

__all__ = [
    "DEFAULT_MAX_FRAGMENTS",
    "DEFAULT_MAX_LAYOUT_BYTES",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "ENCODE_CACHE_ENTRIES",
    "ENCODE_CACHE_ITEMS",
    "FRAME_CACHE_BYTES",
    "FRAME_CACHE_ENTRIES",
    "MAX_ARRAY_AXES",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_DEPTH",
    "MAX_DESCRIPTORS",
    "MAX_INTERLEAVE",
    "MAX_LAYERS",
    "MAX_LAYOUT_BUFFERS",
    "MAX_PAGE_SIZE",
    "MAX_PARTS",
    "MAX_PLAN_FRAGMENTS",
    "MAX_ROWS_PER_PAGE",
    "MAX_STAGES",
    "MAX_TOKENS",
    "MAX_VALUE",
    "MAX_WORLD_SIZE",
]

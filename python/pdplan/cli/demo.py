"""``pdplan demo``: the 70B, TP 8 -> TP 2 walk-through."""

from __future__ import annotations

import time

from pdplan._core import __version__
from pdplan._descriptors import transfer_descriptors
from pdplan._layouts import (
    ModelShape,
)
from pdplan._staging import CostModel
from pdplan.cli.deployment import Deployment
from pdplan.cli.formats import print_table

DEMO_MODEL = "llama-3-70b"
#: Runs of the demo's descriptor build: one cold, the rest warm.
DEMO_RUNS = 4


def demo() -> None:
    shape = ModelShape.preset(DEMO_MODEL)
    planner = Deployment(prefill_tp=8, decode_tp=2).planner(shape)
    print(f"pdplan {__version__} demo: {DEMO_MODEL}")
    print_table(shape, planner, CostModel(), None, name=DEMO_MODEL)
    tokens = 32768
    pages = tokens // shape.page_size
    print()
    print(
        f"a {tokens // 1024}k-token request ({pages} pages), descriptors built per "
        f"(decode rank, prefill rank) pair:"
    )
    import numpy as np

    src_pages = np.arange(pages, dtype=np.int32)
    dst_pages = np.arange(pages, dtype=np.int32)
    src_limits = [b.item_stride_bytes * pages for b in planner.prefill_buffers]
    dst_limits = [b.item_stride_bytes * pages for b in planner.decode_buffers]
    bases = [1 << 40] * len(src_limits)
    pairs = [
        fragments
        for decode_rank in range(planner.decode_layout.world_size)
        for fragments in planner.transfer_fragments(decode_rank).values()
    ]

    def build_all() -> tuple[int, int]:
        total = total_bytes = 0
        for fragments in pairs:
            d = transfer_descriptors(
                fragments,
                bases,
                bases,
                src_pages,
                dst_pages,
                src_limits=src_limits,
                dst_limits=dst_limits,
            )
            total += d.num_descriptors
            total_bytes += d.total_bytes
        return total, total_bytes

    # Timed as the benchmarks' figures are: warm, the best of a few runs (the first call also
    # pays for faulting the arrays' pages in).
    times = []
    for _ in range(DEMO_RUNS):
        started = time.perf_counter()
        total, total_bytes = build_all()
        times.append(time.perf_counter() - started)
    best = min(times[1:])
    print(
        f"  {total:,} descriptors moving {total_bytes / 2**30:.2f} GiB in {len(pairs)} calls: "
        f"{best * 1e3:.1f} ms warm, best of {DEMO_RUNS - 1} ({total / best / 1e6:.0f} M "
        f"descriptors/s; the first, cold run took {times[0] * 1e3:.1f} ms)"
    )
    print(
        "  benches/compare.py times this beside numpy and the plain Python loop "
        "(docs/performance.md, Per-request descriptors)"
    )

"""A router's cost of a request (``Pairing.cost``) beside planning the request: building every
rank pair's descriptors over scattered pages and counting them, in the same run.

    python benches/transfer_cost.py [--repeat 5]

Both give the same descriptors and bytes (checked here, and in tests/test_transfer_cost.py);
the figure is how much sooner the cost is known. Writes benches/results/transfer_cost.md.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pdplan import Pairing, ParallelLayout, PreparedTransfer, token_slots, transfer_descriptors

import provenance

TOKENS = 32768
PREFIX = 4096

SCENARIOS: list[tuple[str, str, ParallelLayout, ParallelLayout, dict[str, Any]]] = [
    ("Llama-3-70B TP 8 -> 2, pages", "llama-3-70b", ParallelLayout("prefill", 8),
     ParallelLayout("decode", 2), {}),
    ("Llama-3-70B TP 8 -> 2, decode pages of 64", "llama-3-70b", ParallelLayout("prefill", 8),
     ParallelLayout("decode", 2), {"decode_page_size": 64}),
    ("Llama-3-70B CP 2 x TP 8 -> TP 2", "llama-3-70b", ParallelLayout("prefill", 16, cp_size=2),
     ParallelLayout("decode", 2), {}),
    ("Gemma-3-27B TP 4 -> 2, pages 16 -> 32", "gemma-3-27b", ParallelLayout("prefill", 4),
     ParallelLayout("decode", 2), {"decode_page_size": 32}),
    ("Qwen3-Next-80B TP 4 -> 1, pages", "qwen3-next-80b-a3b", ParallelLayout("prefill", 4),
     ParallelLayout("decode", 1), {}),
]  # fmt: skip


def best_of(repeat: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def planned(pairing: Pairing) -> tuple[int, int]:
    """Descriptors and bytes of the request, built pair by pair over scattered pages."""
    rng = np.random.default_rng(0)
    planner = pairing.planner
    kv = {b.buffer_index for b in planner.prefill_buffers if b.is_token_indexed}
    sizes = pairing.page_sizes
    counts = [math.ceil(TOKENS / s) for s in sizes]
    capacity = 4 * max(counts) + 8
    tables = [2 * rng.choice(2 * c + 2, size=c, replace=False) for c in counts]
    bases = [(i + 1) << 40 for i in range(len(planner.prefill_buffers))]
    limits = [b.item_stride_bytes * capacity for b in planner.prefill_buffers]
    dst_limits = [b.item_stride_bytes * capacity for b in planner.decode_buffers]
    layouts = (planner.prefill_layout, planner.decode_layout)
    total = total_bytes = 0
    for rank in range(planner.decode_layout.world_size):
        if planner.decode_layout.rank_coordinates(rank).dp_group != 0:
            continue
        for source, fragments in planner.transfer_fragments(rank, num_tokens=TOKENS).items():
            state = [f for f in fragments if f.buffer_index not in kv]
            if planner.token_maps:
                src = token_slots(tables[0], sizes[0], TOKENS, layout=layouts[0], rank=source)
                dst = token_slots(tables[1], sizes[1], TOKENS, layout=layouts[1], rank=rank)
                dst = dst.copy()
                dst[:PREFIX] = -1
                prepared = PreparedTransfer(
                    fragments, bases, bases, src_limits=limits, dst_limits=dst_limits
                )
                d = prepared.token_descriptors(src, dst, buffers=sorted(kv))
            else:
                first = PREFIX // sizes[0]
                d = transfer_descriptors(
                    [f for f in fragments if f.buffer_index in kv], bases, bases,
                    tables[0][first:], tables[1][first:], src_limits=limits,
                    dst_limits=dst_limits,
                )  # fmt: skip
            total, total_bytes = total + d.num_descriptors, total_bytes + d.total_bytes
            if state:
                s = transfer_descriptors(state, bases, bases, [0], [0])
                total, total_bytes = total + s.num_descriptors, total_bytes + s.total_bytes
    return total, total_bytes


def table(repeat: int) -> str:
    lines = [
        f"A {TOKENS:,}-token request, the decode side holding its first {PREFIX:,} tokens, to "
        "decode DP group 0. `Pairing.cost` (the pairing planned once, before the timing) "
        "against planning the request: every rank pair's descriptors built over scattered "
        f"pages and counted. Best of {repeat} runs each.",
        "",
        "| pairing | by | rank pairs | descriptors | GiB | Pairing.cost | planning it | ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, model, prefill, decode, options in SCENARIOS:
        pairing = Pairing(model, prefill, decode, **options)
        cost = pairing.cost(TOKENS, decode_prefix=PREFIX)  # warm: the pairing's counts
        built = planned(pairing)
        if built != (cost.descriptors, cost.bytes):
            raise SystemExit(f"{name}: the cost {cost.descriptors, cost.bytes} != {built}")
        fast = best_of(repeat, lambda p=pairing: p.cost(TOKENS, decode_prefix=PREFIX))
        slow = best_of(repeat, lambda p=pairing: planned(p))
        lines.append(
            f"| {name} | {cost.by} | {len(cost.pairs)} | {cost.descriptors:,} | "
            f"{cost.bytes / 2**30:.2f} | {fast * 1e6:,.0f} µs | {slow * 1e3:,.1f} ms | "
            f"{slow / fast:,.0f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    text = table(args.repeat)
    print(text)
    provenance.write("transfer_cost.md", "# A request's cost against planning it\n\n" + text)


if __name__ == "__main__":
    main()

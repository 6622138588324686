"""Tokens, not pages: what slot-map descriptors cost, side by side in one run.

    python benches/tokens.py [--callgrind]

One 32k-token request of the 70B-like model (80 layers, 8 KV heads, head dim 128, bf16), prefill
TP 8 -> decode TP 2, prefill rank 5's 160 fragments to decode rank 1:

(a) token-major (NHD) 16-token pages on both sides, every token: `token_descriptors` against the
    page path (`descriptors`) on the same prepared transfer: the same descriptors, and the cost;
(b) head-major pages of 16 prefill tokens into 64 decode tokens: count and rate, against the page
    path's time for the same count (head-major 16-token pages) and numpy's per-token way;
(c) building the two slot maps with `token_slots`, against the numpy expression.

Each case shows its descriptor count beside head-major page pairing's (327,680): what a layout
costs a request. --callgrind adds instruction counts for (a) and (b) (valgrind, the stable
measure on this shared machine). Writes benches/results/tokens.md.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pdplan import PDTransferPlanner, PreparedTransfer, token_slots

import callgrind
import provenance
from scenarios import cluster

RESULTS = provenance.RESULTS
TOKENS = 32768
CAPACITY = 8192  # pages each buffer holds


def best_of(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    result = fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs" if seconds < 1e-3 else f"{seconds * 1e3:,.2f} ms"


class Case:
    """One prefill rank's prepared transfer to decode rank 1 and the request's pages."""

    def __init__(self, prefill_page: int, decode_page: int, kv_layout: str = "HND") -> None:
        prefill = cluster(1, 8, 1, 2, page=prefill_page, kv_layout=kv_layout)  # type: ignore[arg-type]
        decode = cluster(1, 8, 1, 2, page=decode_page, kv_layout=kv_layout)  # type: ignore[arg-type]
        planner = PDTransferPlanner(
            prefill_layout=prefill.prefill,
            decode_layout=prefill.decode,
            prefill_buffers=prefill.prefill_buffers,
            decode_buffers=decode.decode_buffers,
            token_maps=True,
        )
        self.fragments = planner.transfer_fragments(1)[5]
        src_limits = [b.item_stride_bytes * CAPACITY for b in planner.prefill_buffers]
        dst_limits = [b.item_stride_bytes * CAPACITY for b in planner.decode_buffers]
        self.src_bases = [0x7F00_0000_0000 + i * n for i, n in enumerate(src_limits)]
        self.dst_bases = [0x7E00_0000_0000 + i * n for i, n in enumerate(dst_limits)]
        self.prepared = PreparedTransfer(
            self.fragments,
            self.src_bases,
            self.dst_bases,
            src_limits=src_limits,
            dst_limits=dst_limits,
        )
        # A paged allocator's pages: two contiguous runs on each side, as benches/scenarios.py.
        self.sizes = (prefill_page, decode_page)
        self.tables = [
            self.table(TOKENS // size, offset) for size, offset in zip(self.sizes, (100, 7))
        ]
        self.slots = [token_slots(t, size, TOKENS) for t, size in zip(self.tables, self.sizes)]

    @staticmethod
    def table(pages: int, offset: int) -> np.ndarray:
        half = pages // 2
        return np.concatenate(
            [
                np.arange(offset, offset + half),
                np.arange(3000 + offset, 3000 + offset + pages - half),
            ]
        ).astype(np.int32)

    def pages(self, coalesce: bool = True) -> Any:
        return self.prepared.descriptors(*self.tables, coalesce=coalesce)

    def tokens(self, coalesce: bool = True) -> Any:
        return self.prepared.token_descriptors(*self.slots, coalesce=coalesce)

    def numpy_per_token(self) -> int:
        """The naive vectorised way: one descriptor per token and run, no merging, no checks."""
        src_slots, dst_slots = self.slots
        moved = (src_slots >= 0) & (dst_slots >= 0)
        s, d = src_slots[moved], dst_slots[moved]
        count = 0
        for f in self.fragments:
            sp, so = np.divmod(s, f.src_page_size)
            dp, do = np.divmod(d, f.dst_page_size)
            src_base = self.src_bases[f.buffer_index] + f.src_byte_offset
            dst_base = self.dst_bases[f.buffer_index] + f.dst_byte_offset
            for run in range(f.token_runs):
                src = src_base + sp * f.src_page_stride_bytes + so * f.src_token_stride_bytes
                dst = dst_base + dp * f.dst_page_stride_bytes + do * f.dst_token_stride_bytes
                src = src + run * f.src_token_run_stride_bytes
                dst = dst + run * f.dst_token_run_stride_bytes
                np.column_stack((src, dst, np.full_like(src, f.token_run_bytes)))
                count += len(src)
        return count


CALLGRIND_SCRIPT = """
import sys
sys.path.insert(0, {benches!r})
import tokens
way, count = sys.argv[1], int(sys.argv[2])
nhd = way.startswith("a_") and tokens.Case(16, 16, "NHD")
grow = way == "b_tokens" and tokens.Case(16, 64)
head_major = way == "b_pages" and tokens.Case(16, 16)
call = {{
    "a_pages": lambda: nhd.pages(),
    "a_tokens": lambda: nhd.tokens(),
    "b_tokens": lambda: grow.tokens(coalesce=False),
    "b_pages": lambda: head_major.pages(coalesce=False),
}}[way]
call()
for _ in range(count):
    call()
"""


def instructions(way: str, count: int = 3) -> float:
    """Instructions per call of one way under callgrind."""
    script = CALLGRIND_SCRIPT.format(benches=str(Path(__file__).resolve().parent))
    return callgrind.instructions(script, [way], count)


def tables(repeat: int, callgrind: bool) -> str:
    head_major = Case(16, 16)
    pairing = head_major.pages(coalesce=False).num_descriptors  # 160 x 2048
    t_hm_pages, _ = best_of(lambda: head_major.pages(coalesce=False), repeat)

    # (a) NHD, equal page sizes, every token.
    nhd = Case(16, 16, "NHD")
    t_pages, by_pages = best_of(nhd.pages, repeat)
    t_tokens, by_tokens = best_of(nhd.tokens, repeat)
    assert all(np.array_equal(a, b) for a, b in zip(by_tokens, by_pages)), "(a) must be identical"
    n_a = by_tokens.num_descriptors

    # (b) head-major 16 -> 64.
    grow = Case(16, 64)
    t_b, unmerged = best_of(lambda: grow.tokens(coalesce=False), repeat)
    t_b_merged, merged = best_of(grow.tokens, repeat)
    t_b_numpy, per_token = best_of(grow.numpy_per_token, max(1, repeat // 4))
    assert unmerged.total_bytes == merged.total_bytes == head_major.pages().total_bytes
    n_b = unmerged.num_descriptors

    # (c) slot maps.
    def build_slots() -> None:
        for table, size in zip(grow.tables, grow.sizes):
            token_slots(table, size, TOKENS)

    def numpy_slots() -> None:
        t = np.arange(TOKENS)
        for table, size in zip(grow.tables, grow.sizes):
            table.astype(np.int64)[t // size] * size + t % size

    t_c, _ = best_of(build_slots, repeat * 4)
    t_c_numpy, _ = best_of(numpy_slots, repeat * 4)

    lines = [
        f"One {TOKENS:,}-token request, 70B-like model, prefill TP 8 -> decode TP 2, one prefill "
        f"rank's {len(nhd.fragments)} fragments; head-major page pairing moves it in {pairing:,} "
        "descriptors.",
        "",
        "| case | way | descriptors | time | descriptors / s | ratio | target |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
        "| (a) NHD 16 -> 16, every token | page path `descriptors` | "
        f"{by_pages.num_descriptors:,} | "
        f"{fmt(t_pages)} | {by_pages.num_descriptors / t_pages:,.0f} | — | — |",
        f"| (a) | `token_descriptors` (identical output) | {n_a:,} | {fmt(t_tokens)} | "
        f"{n_a / t_tokens:,.0f} | {t_tokens / t_pages:.2f}× the page path | ≤ 1.5× |",
        f"| (b) head-major 16 -> 64 | `token_descriptors(coalesce=False)` | {n_b:,} | "
        f"{fmt(t_b)} | "
        f"{n_b / t_b:,.0f} | {t_b / t_hm_pages:.2f}× the page path's {pairing:,} (16 -> 16) | "
        "≥ 300 M/s, ≤ 2× |",
        f"| (b) | `token_descriptors()` (coalesced) | {merged.num_descriptors:,} | "
        f"{fmt(t_b_merged)} | "
        f"{n_b / t_b_merged:,.0f} | — | — |",
        f"| (b) | numpy, a descriptor per token and run (no merging, no checks) | {per_token:,} | "
        f"{fmt(t_b_numpy)} | {per_token / t_b_numpy:,.0f} | "
        f"pdplan {t_b_numpy / t_b:,.0f}× faster | — |",
        f"| (c) two slot maps of {TOKENS:,} tokens | `token_slots` x 2 | — | {fmt(t_c)} | "
        "— | — | — |",
        f"| (c) | numpy `table[t // size] * size + t % size` x 2 | — | {fmt(t_c_numpy)} | — | "
        f"pdplan {t_c_numpy / t_c:.1f}× faster | — |",
        "",
        f"Page path for head-major 16-token pages (the (b) comparison): {fmt(t_hm_pages)} for "
        f"{pairing:,} descriptors. (b)'s coalesced count is lower because this request's pages "
        "are two contiguous runs: consecutive 16-token source pages continue each other in the "
        "64-token decode page.",
    ]
    if callgrind:
        a_pages, a_tokens = instructions("a_pages"), instructions("a_tokens")
        b_pages, b_tokens = instructions("b_pages"), instructions("b_tokens")
        lines += [
            "",
            "Instructions per request (valgrind --tool=callgrind, the stable measure): (a) page "
            f"path {a_pages:,.0f}, `token_descriptors` {a_tokens:,.0f} "
            f"({a_tokens / a_pages:.2f}×); "
            f"(b) `token_descriptors(coalesce=False)` {b_tokens:,.0f} against the page path's "
            f"{b_pages:,.0f} for the same count ({b_tokens / b_pages:.2f}×).",
        ]
    text = "\n".join(lines)
    print(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--callgrind", action="store_true", help="add instruction counts for (a) and (b)"
    )
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    provenance.write("tokens.md", tables(args.repeat, args.callgrind))


if __name__ == "__main__":
    main()

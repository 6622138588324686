"""A request from layouts exchanged once, side by side in one run with today's
frames-per-request path and the reference path.

    python benches/exchanged.py [--reference path/to/transfer_plan.py] [--callgrind]

70B-like model (80 layers, 8 KV heads, head dim 128, bf16, 16-token pages), prefill TP 8 ->
decode TP 2, prefill rank 5 -> decode rank 1 (160 fragments). Once per peer, each side sends
its layout (``encode_layout``), the other decodes it and builds the planner and the pair's
``PreparedTransfer.from_layouts``; per request only the pages travel. Ways compared, per
request of 4 pages:

- exchanged: ``prepared.descriptors(src_pages, dst_pages)`` on the transfer prepared once;
- frames per request: the fragments' frames arrive with every request
  (``PreparedTransfer.from_frames(...).descriptors(...)``, as benches/per_request.py);
- reference path: the reference's decoder (``--reference``; else the pure-Python one in
  benches/pure_python.py) and the runtime's per-page Python loop.

Timings are best-of on a shared 2-core machine; ``--callgrind`` adds instruction counts per
request (valgrind, the stable measure). Writes benches/results/exchanged.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from per_request import Setup, best, fmt

from pdplan import (
    PDTransferPlanner,
    PreparedTransfer,
    decode_layout,
    encode_layout,
)

import callgrind
import provenance
from scenarios import cluster

RESULTS = provenance.RESULTS
PAGES = 4
DECODE_RANK, PREFILL_RANK = 1, 5


class Exchanged:
    """Both sides after the one exchange: the prefill rank's planner and prepared transfer."""

    def __init__(self, setup: Setup) -> None:
        s = cluster(1, 8, 1, 2, layers=80, heads=8, head_dim=128, page=16)
        self.frames = encode_layout(
            s.decode,
            s.decode_buffers,
            base_ptrs=setup.dst_bases.tolist(),
            limits=setup.dst_limits.tolist(),
        )
        started = time.perf_counter()
        peer = decode_layout(*self.frames)
        self.planner = PDTransferPlanner(
            prefill_layout=s.prefill,
            decode_layout=peer.layout,
            prefill_buffers=s.prefill_buffers,
            decode_buffers=peer.buffers,
        )
        self.prepared = PreparedTransfer.from_layouts(
            self.planner,
            DECODE_RANK,
            PREFILL_RANK,
            setup.src_bases,
            peer.base_ptrs or (),
            src_limits=setup.src_limits,
            dst_limits=peer.limits,
        )
        self.once = time.perf_counter() - started
        self.pages = setup.pages[PAGES]

    def request(self) -> Any:
        return self.prepared.descriptors(*self.pages)


CALLGRIND_SCRIPT = """
import sys
sys.path.insert(0, {benches!r})
import exchanged, per_request
setup = per_request.Setup({reference!r})
ex = exchanged.Exchanged(setup)
way, count = sys.argv[1], int(sys.argv[2])
call = {{
    "exchanged": ex.request,
    "frames_per_request": lambda: setup.prepared({pages}),
    "reference_path": lambda: setup.baseline({pages}),
}}[way]
call()
for _ in range(count):
    call()
"""


def instructions(way: str, count: int, reference: Path | None) -> float:
    script = CALLGRIND_SCRIPT.format(
        benches=str(Path(__file__).resolve().parent),
        reference=str(reference) if reference else None,
        pages=PAGES,
    )
    return callgrind.instructions(script, [way], count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, metavar="transfer_plan.py")
    parser.add_argument("--callgrind", action="store_true", help="add instruction counts")
    args = parser.parse_args()
    setup = Setup(args.reference)
    ex = Exchanged(setup)
    # Agreement first: the three ways build the same descriptors.
    expected = setup.baseline(PAGES)
    for got in (ex.request(), setup.prepared(PAGES)):
        assert [tuple(r) for r in got.as_array().tolist()] == expected
    count = len(expected)
    t_reference = best(lambda: setup.baseline(PAGES), 1.0)
    t_frames = best(lambda: setup.prepared(PAGES))
    t_exchanged = best(ex.request, 1.0)
    base_name = "reference decode" if args.reference else "pure-Python decode"
    lines = [
        f"70B-like, prefill TP 8 -> decode TP 2, prefill rank {PREFILL_RANK} -> decode rank "
        f"{DECODE_RANK}: a {PAGES}-page request ({count} descriptors). Reference path: "
        f"{base_name} + per-page Python loop.",
        "",
        "| way | per request | vs reference path | target |",
        "| --- | ---: | ---: | ---: |",
        f"| reference path (frames + Python loop) | {fmt(t_reference)} | 1× | — |",
        f"| frames per request (from_frames + descriptors) | {fmt(t_frames)} | "
        f"{t_reference / t_frames:,.0f}× | — |",
        f"| exchanged layouts (descriptors only) | {fmt(t_exchanged)} | "
        f"{t_reference / t_exchanged:,.0f}× | ≤ 5 µs, ≥ 150× |",
        "",
        f"Once per peer (decode_layout + planner + from_layouts): {fmt(ex.once)}.",
    ]
    if args.callgrind:
        lines += [
            "",
            "Instructions per request (valgrind --tool=callgrind, the stable measure):",
            "",
            "| way | instructions | vs reference path |",
            "| --- | ---: | ---: |",
        ]
        counts = {
            way: instructions(way, calls, args.reference)
            for way, calls in (
                ("reference_path", 20),
                ("frames_per_request", 400),
                ("exchanged", 1000),
            )
        }
        for way, n in counts.items():
            lines.append(f"| {way} | {n:,.0f} | {counts['reference_path'] / n:,.0f}× |")
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    provenance.write("exchanged.md", text)


if __name__ == "__main__":
    main()

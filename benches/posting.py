"""What NIXL 1.5 takes here per flat descriptor, per strided row and per block of a row
(``pdplan.calibrate_posting`` through two agents on loopback, UCX, DRAM), and the form the cost
model then chooses for the requests of ``benches/nixl_strided.py``.

    python benches/posting.py [--repeat 7] [--rounds 5]   # writes benches/results/posting.md

The calibration moves 64-byte blocks of two registered numpy buffers at 64, 512 and 2,048
descriptors, rows or blocks, each shape timed ``--repeat`` times, best kept; the core fits a
line through each; ``--rounds`` calibrations, their median kept (loopback varies run to run).
The default cost model's ``per_row_s`` and ``per_block_s`` are the median's as fractions of its
``per_descriptor_s`` (a NIC's figure, not loopback's).
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import replace

import numpy as np
from nixl_strided import Loopback

from pdplan import (
    Pairing,
    ParallelLayout,
    PreparedTransfer,
    StridedDescriptors,
    TransferDescriptors,
    calibrate_posting,
)

import provenance

SPAN = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    link = Loopback()
    source, target = np.zeros(SPAN, np.uint8), np.zeros(SPAN, np.uint8)
    link.register([source], [target])
    agent = link.source

    def move_flat(d: TransferDescriptors) -> None:
        zeros = np.zeros_like(d.lengths)
        local = agent.get_xfer_descs(np.column_stack((d.src_addrs, d.lengths, zeros)), "DRAM")
        remote = agent.get_xfer_descs(np.column_stack((d.dst_addrs, d.lengths, zeros)), "DRAM")
        link.wait(agent.initialize_xfer("WRITE", local, remote, link.peer))

    def move_strided(s: StridedDescriptors) -> None:
        local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", s.src, "DRAM")
        remote = agent.prep_xfer_dlist(link.peer, s.dst, "DRAM")
        every = np.arange(s.num_descriptors, dtype=np.int32)
        link.wait(agent.make_prepped_xfer("WRITE", local, every, remote, every))
        agent.release_dlist_handle(local)
        agent.release_dlist_handle(remote)

    base = (source.ctypes.data, SPAN), (target.ctypes.data, SPAN)
    runs = [
        calibrate_posting(move_flat, move_strided, src=base[0], dst=base[1], repeat=args.repeat)
        for _ in range(args.rounds)
    ]
    figures = [(r.model.per_descriptor_s, r.model.per_row_s, r.model.per_block_s) for r in runs]
    median = [statistics.median(f[i] for f in figures) for i in range(3)]
    m = replace(runs[0].model, per_descriptor_s=median[0], per_row_s=median[1],
                per_block_s=median[2])  # fmt: skip
    lines = [
        f"Two NIXL agents on loopback (UCX, DRAM), 64-byte blocks at 64, 512 and 2,048 "
        f"descriptors, blocks or rows, each best of {args.repeat}; {args.rounds} calibrations, "
        "each fitting a line through its times:",
        "",
        "| calibration | per flat descriptor | per strided row | per block of a row | row / "
        "descriptor | block / descriptor |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for i, (d, r, b) in enumerate([*figures, tuple(median)]):
        label = "median" if i == len(figures) else str(i + 1)
        lines.append(
            f"| {label} | {d * 1e6:.3f} µs | {r * 1e6:.3f} µs | {b * 1e6:.3f} µs | "
            f"{r / d:.2f}x | {b / d:.2f}x |"
        )
    lines += [
        "",
        "The form the median model chooses between NIXL's two "
        "(`CostModel.choose_form(..., forms=('flat', 'strided'))`), one prefill rank's share of "
        "a 32k-token request, its pages consecutive or random ids:",
        "",
        "| request | pages | flat descriptors | strided rows | flat | strided | chosen |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    rng = np.random.default_rng(7)
    for name, model, prefill, decode in (
        ("Llama-3-70B TP 8 -> 2", "llama-3-70b", 8, 2),
        ("Llama-3-8B TP 4 -> 2", "llama-3-8b", 4, 2),
    ):
        pairing = Pairing(
            model, ParallelLayout("prefill", prefill), ParallelLayout("decode", decode)
        )
        planner = pairing.planner
        pages = 32768 // planner.prefill_buffers[0].page_size
        bases = [(i + 1) << 40 for i in range(len(planner.prefill_buffers))]
        limits = [b.item_stride_bytes * 4 * pages for b in planner.prefill_buffers]
        dst_limits = [b.item_stride_bytes * 4 * pages for b in planner.decode_buffers]
        source_rank = next(iter(planner.transfer_fragments(0)))
        prepared = PreparedTransfer.from_layouts(
            planner, 0, source_rank, bases, bases, src_limits=limits, dst_limits=dst_limits
        )
        tables = {
            "consecutive": (np.arange(pages), np.arange(pages) + 1),
            "random ids": tuple(rng.choice(4 * pages, size=pages, replace=False) for _ in "sd"),
        }
        for label, (src, dst) in tables.items():
            e = m.choose_form(prepared, src, dst, forms=("flat", "strided"))
            lines.append(
                f"| {name} | {label} | {e.descriptors:,} | {e.strided_rows or 0:,} | "
                f"{e.flat_s * 1e3:,.2f} ms | {(e.strided_s or 0) * 1e3:,.2f} ms | {e.form} |"
            )
    text = "\n".join(lines)
    print(text)
    provenance.write("posting.md", "# Posting costs through NIXL, calibrated\n\n" + text)
    os._exit(0)  # NIXL agents crash the interpreter at exit


if __name__ == "__main__":
    main()

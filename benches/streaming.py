"""Streaming a request while prefill runs: every (layer group, prefill rank) slice's
descriptors beside the whole request's, and the layer groups the cost model chooses by length.

    python benches/streaming.py [--repeat 20]

A Llama-3-70B request of 32k tokens, TP 8 -> 2 (decode rank 0 reads four prefill ranks),
16-token pages, contiguous page runs (a fresh allocator's) and scattered ones (every other
page, backwards: nothing coalesces, no stride compresses). Slices are the groups
``Pairing.layer_groups`` chooses, or ten of 8 layers, as flat descriptors and as strided
lists; their descriptors together equal the whole request's (checked here). Writes
benches/results/streaming.md.
"""

from __future__ import annotations

import argparse

import numpy as np
from transfer_cost import best_of

from pdplan import Pairing, ParallelLayout, PreparedTransfer

import callgrind
import provenance

TOKENS = 32768
PAGE = 16


def slices_table(repeat: int) -> list[str]:
    pairing = Pairing("llama-3-70b", ParallelLayout("prefill", 8), ParallelLayout("decode", 2))
    planner = pairing.planner
    chosen = pairing.layer_groups(TOKENS).groups
    tenths = tuple(range(a, a + 8) for a in range(0, 80, 8))
    pages = TOKENS // PAGE
    capacity = 2 * pages + 2
    bases = [(i + 1) << 40 for i in range(len(planner.prefill_buffers))]
    limits = [b.item_stride_bytes * capacity for b in planner.prefill_buffers]
    dst_limits = [b.item_stride_bytes * capacity for b in planner.decode_buffers]
    tables = {
        "contiguous pages": (np.arange(pages), np.arange(pages) + 1),
        "scattered pages": (np.arange(2 * pages - 2, -1, -2), np.arange(2 * pages - 2, -1, -2)),
    }
    lines = [
        f"Llama-3-70B, TP 8 -> 2, a {TOKENS:,}-token request in {PAGE}-token pages; decode rank "
        f"0 and its {len(planner.transfer_fragments(0))} prefill ranks. Groups: the "
        f"{len(chosen)} `Pairing.layer_groups({TOKENS})` chooses "
        f"({', '.join(f'{g.start}-{g.stop - 1}' for g in chosen)}), or ten of 8 layers. "
        "Flat: `descriptors(...)`; strided: `strided_descriptors(...)` (NIXL 1.5's N x 5 "
        f"lists). Best of {repeat} runs.",
        "",
        "| groups | pages | form | whole request, a prefill rank | slice (layer group, prefill "
        "rank): slowest | all slices of a prefill rank | all / whole | all / whole flat "
        "(the default form) | most entries a slice |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    forms = {
        "flat": lambda p, s, d, **k: p.descriptors(s, d, **k),
        "strided": lambda p, s, d, **k: p.strided_descriptors(s, d, **k),
        # The request's pages read once (a PreparedRequest), its slices then asked of it.
        "strided, pages read once": lambda p, s, d, **k: p.strided_descriptors(s, d, **k),
    }
    whole_flat: dict[tuple[str, str], float] = {}
    for (label, groups), (name, (src, dst)), (form, build) in (
        (g, t, f) for g in (("chosen", chosen), ("ten of 8", tenths)) for t in tables.items()
        for f in forms.items()
    ):  # fmt: skip
        whole_s = slowest = together_s = 0.0
        most = 0
        for source in planner.transfer_fragments(0):
            prepared = PreparedTransfer.from_layouts(
                planner, 0, source, bases, bases, src_limits=limits, dst_limits=dst_limits
            )
            whole = build(prepared, src, dst)
            parts = [build(prepared, src, dst, layers=g) for g in groups]
            if (
                sum(p.num_descriptors for p in parts) != whole.num_descriptors
                or sum(p.total_bytes for p in parts) != whole.total_bytes
            ):
                raise SystemExit(f"{name}: the slices do not add up to the whole request")
            strided = form != "flat"
            size = (lambda p: p.num_entries) if strided else (lambda p: p.num_descriptors)
            most = max(most, *(size(p) for p in parts))
            whole_s = max(
                whole_s,
                best_of(repeat, lambda p=prepared, s=src, d=dst, b=build: b(p, s, d)),
            )
            if form == "strided, pages read once":
                request = prepared.request(src, dst)
                times = [
                    best_of(repeat, lambda g=g, r=request: r.strided_descriptors(layers=g))
                    for g in groups
                ]
                # All of them: the reading of the pages, then each slice.
                together = best_of(
                    repeat,
                    lambda p=prepared, s=src, d=dst, gs=groups: [
                        r.strided_descriptors(layers=g) for r in [p.request(s, d)] for g in gs
                    ],
                )
            else:
                times = [
                    best_of(
                        repeat, lambda p=prepared, g=g, s=src, d=dst, b=build: b(p, s, d, layers=g)
                    )
                    for g in groups
                ]
                together = sum(times)
            slowest = max(slowest, *times)
            together_s = max(together_s, together)
        # Forms run flat first: the strided slices against the request as flat descriptors.
        flat_s = whole_flat.setdefault((label, name), whole_s)
        lines.append(
            f"| {label} | {name} | {form} | {whole_s * 1e6:,.1f} µs | {slowest * 1e6:,.1f} µs | "
            f"{together_s * 1e6:,.1f} µs | {together_s / whole_s:.2f}x | "
            f"{together_s / flat_s:.2f}x | {most:,} |"
        )
    return lines


def groups_table() -> list[str]:
    pairing = Pairing("llama-3-70b", ParallelLayout("prefill", 8), ParallelLayout("decode", 2))
    lines = [
        "",
        "Layer groups chosen by length (the cost model's defaults; 20 µs a transfer; prefill "
        "2.5 µs a token a layer): the time from prefill's end to the last byte landed, "
        "streamed in the groups against the whole request after prefill.",
        "",
        "| tokens | groups | streamed: prefill end to last byte | whole request after prefill |",
        "|---:|---:|---:|---:|",
    ]
    for tokens in (256, 1024, 4096, 32768):
        g = pairing.layer_groups(tokens)
        lines.append(
            f"| {tokens:,} | {len(g.groups)} | {g.tail_s * 1e3:,.3f} ms | "
            f"{g.whole_tail_s * 1e3:,.3f} ms |"
        )
    return lines


CALLGRIND_SCRIPT = """
import sys
import numpy as np
from pdplan import Pairing, ParallelLayout, PreparedTransfer

form, groups, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
pairing = Pairing("llama-3-70b", ParallelLayout("prefill", 8), ParallelLayout("decode", 2))
planner = pairing.planner
pages = {tokens} // {page}
bases = [(i + 1) << 40 for i in range(len(planner.prefill_buffers))]
limits = [b.item_stride_bytes * (2 * pages + 2) for b in planner.prefill_buffers]
dst_limits = [b.item_stride_bytes * (2 * pages + 2) for b in planner.decode_buffers]
source = next(iter(planner.transfer_fragments(0)))
prepared = PreparedTransfer.from_layouts(planner, 0, source, bases, bases, src_limits=limits,
                                         dst_limits=dst_limits)
src, dst = np.arange(pages), np.arange(pages) + 1
named = {{
    "whole": [None], "77": [range(77)], "8": [range(8)],
    "chosen": list(pairing.layer_groups({tokens}).groups),
    "tenths": [range(a, a + 8) for a in range(0, 80, 8)],
}}[groups]
if form == "request" and len(named) == 1:  # a slice of a request already read
    request = prepared.request(src, dst)
    def run():
        request.strided_descriptors(layers=named[0])
elif form == "request":  # the request read once, then each slice
    def run():
        request = prepared.request(src, dst)
        for group in named:
            request.strided_descriptors(layers=group)
else:
    build = prepared.strided_descriptors if form == "strided" else prepared.descriptors
    def run():
        for group in named:
            build(src, dst, layers=group)
run()  # what a first call does once (lazy imports) is not counted
for _ in range(count):
    run()
"""


def callgrind_table() -> list[str]:
    """Instructions under callgrind (stable where timings are not), contiguous pages."""
    script = CALLGRIND_SCRIPT.format(tokens=TOKENS, page=PAGE)
    forms = ("flat", "strided", "request")
    counts = {
        (form, groups): callgrind.instructions(script, [form, groups], 20)
        for form in forms
        for groups in ("whole", "77", "8", "chosen", "tenths")
        if not (form == "request" and groups == "whole")
    }
    counts[("request", "whole")] = counts[("strided", "whole")]
    lines = [
        "",
        "Instructions under callgrind (`valgrind --tool=callgrind`, the difference between 20 "
        "runs and none after one, over 20: the same count whatever else the machine runs), one "
        "prefill rank, contiguous pages, layers as a `range`. `request`: the request's pages "
        "read once (`prepared.request(src, dst)`, a `PreparedRequest`), then each slice of it "
        "(its single slices of a request already read; its slices together with the reading, "
        "against the whole request strided in one call):",
        "",
        "| form | whole request (80 layers) | a slice of 77 layers | a slice of 8 layers | "
        "the chosen groups' slices / whole | ten slices of 8 / whole |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for form in forms:
        c = {groups: counts[(form, groups)] for groups in ("whole", "77", "8", "chosen", "tenths")}
        lines.append(
            f"| {form} | {c['whole']:,.0f} | {c['77']:,.0f} | {c['8']:,.0f} | "
            f"{c['chosen'] / c['whole']:.2f}x | {c['tenths'] / c['whole']:.2f}x |"
        )
    flat, strided = counts[("flat", "8")], counts[("strided", "8")]
    lines += [
        "",
        f"A slice of 8 layers strided: {flat / strided:.1f}x fewer instructions than flat.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    text = "\n".join(slices_table(args.repeat) + callgrind_table() + groups_table())
    print(text)
    provenance.write("streaming.md", "# Streaming a request while prefill runs\n\n" + text)


if __name__ == "__main__":
    main()

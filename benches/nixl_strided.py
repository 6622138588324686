"""Flat against strided descriptors through NIXL 1.5 on loopback (two agents, UCX, DRAM): how
many descriptors a request posts, and the time from its page ids to the transfer complete.

    python benches/nixl_strided.py [--rounds 15]   # writes benches/results/nixl_strided.md

Flat: ``descriptors(...)`` (coalesced), ``get_xfer_descs`` of N x 3 rows on each side,
``initialize_xfer``. Strided: ``strided_descriptors(...)``, ``prep_xfer_dlist`` of each N x 5
list, ``make_prepped_xfer`` over every block. Both then ``transfer`` and poll until done; the
bytes land in real numpy buffers (only the buffers the request touches are allocated). Cases:
a Llama-3-70B TP 8 -> 2 request of 32k tokens (one prefill rank, an 8-layer group), a
DeepSeek-V3 MLA request from a DP-attention prefill (DEP 8) to decode TP 4 (whole latent pages:
flat descriptors of consecutive pages already coalesce), a token-major (NHD) TP 4 -> 2 request
of 8k tokens, each with consecutive pages and with a fragmented page table (random page ids).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pdplan import (
    AttentionLayer,
    CostModel,
    ModelShape,
    Pairing,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    model_buffer_layouts,
)

import provenance


class Loopback:
    """A prefill agent writing into a decode agent's memory, both in this process."""

    def __init__(self) -> None:
        from nixl_cu12._api import nixl_agent, nixl_agent_config

        if not (os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband")):
            os.environ.setdefault("UCX_MODULES", "^ib")
        self.source = nixl_agent("bench-prefill", nixl_agent_config(backends=["UCX"]))
        self.target = nixl_agent("bench-decode", nixl_agent_config(backends=["UCX"]))
        name = self.source.add_remote_agent(self.target.get_agent_metadata())
        self.peer = name.decode() if isinstance(name, bytes) else name

    def register(self, source: list[np.ndarray], target: list[np.ndarray]) -> None:
        self.held = [*getattr(self, "held", []), *source, *target]  # registered: kept alive
        for agent, arrays in ((self.source, source), (self.target, target)):
            for a in arrays:
                agent.register_memory(np.array([[a.ctypes.data, a.nbytes, 0]], np.uint64), "DRAM")
        # The target's registrations reach the source with its metadata, sent again.
        self.source.add_remote_agent(self.target.get_agent_metadata())

    def wait(self, handle: Any) -> None:
        state = self.source.transfer(handle)
        while state not in ("DONE", "ERR"):
            state = self.source.check_xfer_state(handle)
        self.source.release_xfer_handle(handle)
        assert state == "DONE", state

    def flat(self, prepared: PreparedTransfer, pages: Any, **kwargs: Any) -> int:
        d = prepared.descriptors(*pages, **kwargs)
        zeros = np.zeros_like(d.lengths)
        local = self.source.get_xfer_descs(np.column_stack((d.src_addrs, d.lengths, zeros)), "DRAM")
        remote = self.source.get_xfer_descs(
            np.column_stack((d.dst_addrs, d.lengths, zeros)), "DRAM"
        )
        self.wait(self.source.initialize_xfer("WRITE", local, remote, self.peer))
        return d.num_descriptors

    def strided(self, prepared: PreparedTransfer, pages: Any, **kwargs: Any) -> int:
        s = prepared.strided_descriptors(*pages, **kwargs)
        local = self.source.prep_xfer_dlist("NIXL_INIT_AGENT", s.src, "DRAM")
        remote = self.source.prep_xfer_dlist(self.peer, s.dst, "DRAM")
        every = np.arange(s.num_descriptors, dtype=np.int32)
        self.wait(self.source.make_prepped_xfer("WRITE", local, every, remote, every))
        self.source.release_dlist_handle(local)
        self.source.release_dlist_handle(remote)
        return s.num_entries


def case(planner: PDTransferPlanner, pages: int, touched: list[int], link: Loopback,
         **kwargs: Any) -> Callable[[Any], PreparedTransfer]:  # fmt: skip
    """Decode rank 0's transfer from its first prefill rank, memory for the ``touched`` buffers
    (others get addresses nothing reads)."""
    capacity = pages + 1
    source_rank = next(iter(planner.transfer_fragments(0)))

    def side(buffers: Any) -> tuple[list[int], list[int], list[np.ndarray]]:
        arrays = {i: np.zeros(buffers[i].item_stride_bytes * capacity, np.uint8) for i in touched}
        bases = [arrays[i].ctypes.data if i in arrays else 1 << 44 for i in range(len(buffers))]
        limits = [b.item_stride_bytes * capacity for b in buffers]
        return bases, limits, list(arrays.values())

    src_bases, src_limits, src_arrays = side(planner.prefill_buffers)
    dst_bases, dst_limits, dst_arrays = side(planner.decode_buffers)
    src_arrays[0][:] = 7  # something to move
    link.register(src_arrays, dst_arrays)
    return PreparedTransfer.from_layouts(
        planner, 0, source_rank, src_bases, dst_bases, src_limits=src_limits, dst_limits=dst_limits
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    link = Loopback()
    rng = np.random.default_rng(0)
    seventy = Pairing("llama-3-70b", ParallelLayout("prefill", 8), ParallelLayout("decode", 2))
    shape = ModelShape(layer_kinds=(AttentionLayer(8, 128),) * 8, dtype="bfloat16", page_size=16)
    prefill, _ = model_buffer_layouts(shape, 4, 4, "NHD")
    _, decode = model_buffer_layouts(shape, 2, 2, "NHD")
    nhd = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 4), decode_layout=ParallelLayout("decode", 2),
        prefill_buffers=prefill, decode_buffers=decode,
    )  # fmt: skip
    deepseek = Pairing("deepseek-v3", ParallelLayout("prefill", 8, dp_size=8),
                       ParallelLayout("decode", 4))  # fmt: skip
    cases = [
        ("Llama-3-70B TP 8 -> 2, 32k tokens, layers 0-7", seventy.planner, 2048,
         list(range(16)), {"layers": range(8)}),
        ("DeepSeek-V3 MLA, DEP 8 -> TP 4, 8k tokens, layers 0-7", deepseek.planner, 512,
         list(range(8)), {"layers": range(8)}),
        ("8 layers of 8 KV heads (NHD) TP 4 -> 2, 8k tokens", nhd, 512, list(range(16)), {}),
    ]  # fmt: skip
    lines = [
        f"NIXL 1.5.1 (nixl-cu12), UCX on loopback, DRAM, two agents in one process. Median of "
        f"{args.rounds} rounds, each from page ids to the transfer done.",
        "",
        "| request | pages | flat descriptors | strided rows | flat: ids to done | "
        "strided: ids to done | strided / flat | the connector reads |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for label, planner, pages, touched, kwargs in cases:
        prepared = case(planner, pages, touched, link, **kwargs)
        tables = {
            "consecutive": (np.arange(pages), np.arange(pages)),
            "fragmented": (rng.permutation(pages + 1)[:pages], rng.permutation(pages + 1)[:pages]),
        }
        for name, table in tables.items():
            times: dict[str, list[float]] = {"flat": [], "strided": []}
            counts = {}
            for _ in range(args.rounds):
                for form, move in (("flat", link.flat), ("strided", link.strided)):
                    started = time.perf_counter()
                    counts[form] = move(prepared, table, **kwargs)
                    times[form].append(time.perf_counter() - started)
            flat, strided = (statistics.median(times[f]) for f in ("flat", "strided"))
            # connectors/_reads.py: the form the default cost model chooses for these rows.
            rows = prepared.strided_descriptors(*table, **kwargs)
            counts_of = (rows.num_descriptors, 0, 0, 0, rows.total_bytes)
            chosen = (
                CostModel()
                .choose_form_counts(
                    counts_of, strided=(rows.num_entries, rows.num_descriptors), staging=False
                )
                .form
            )
            lines.append(
                f"| {label} | {name} | {counts['flat']:,} | {counts['strided']:,} | "
                f"{flat * 1e3:,.2f} ms | {strided * 1e3:,.2f} ms | {strided / flat:.2f} | "
                f"{chosen} |"
            )
    text = "\n".join(lines)
    print(text, flush=True)
    provenance.write("nixl_strided.md", "# Flat against strided lists through NIXL\n\n" + text)
    os._exit(0)  # NIXL agents crash the interpreter at exit


if __name__ == "__main__":
    main()

"""Staging plans: what staging saves a request, what the host copies cost against the machine's
copy limit, and the cost model calibrated on this machine beside measured NIXL times.

    python benches/staging.py [--layers 8]

Three layouts of a 32k-token request (64-token pages, scattered):

- token-major (NHD) Llama-3-70B, prefill TP 8 -> decode TP 2: a descriptor per token row and
  buffer, 256 B (one head of 128 bf16);
- DeepSeek-V3-like MLA, TP 8 -> TP 8 x DCP 8 at interleave 1: a descriptor per token and layer,
  1,152 B (one latent);
- head-major (HND) Llama-3-70B, TP 2 -> TP 8: a descriptor per page and buffer, 16 KiB.

1. Descriptors a request takes, direct and staged, for the whole model (the command's
   `request_pairs`, no memory), and the default cost model's choice.
2. One rank pair over real host memory (the first `--layers` layers, so that the caches fit):
   `StagingPlan.pack` / `unpack` against `numpy.copyto` of the same bytes, in the same run.
3. A cost model calibrated here: copies from `numpy.copyto` and a pack of 64-byte segments, the
   engine from NIXL (UCX, two agents in this process, DRAM to DRAM) moving one 64 MiB
   descriptor and 100,000 64-byte ones; its predictions beside the measured NIXL direct and
   staged (pack + one descriptor + unpack) times of the same pair.
4. Mooncake (TCP on 127.0.0.1, one process a side, through `examples/pd_transfer.py`): every
   rank pair of a smaller request, direct and staged, timed by the harness.

Writes benches/results/staging.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pdplan import (
    CostModel,
    ModelShape,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    StagingPlan,
    TransferDescriptors,
    model_buffer_layouts,
    token_slots,
)
from pdplan._request import request_pairs

import provenance
from tokens import best_of, fmt

RESULTS = provenance.RESULTS
TOKENS = 32768
PAGE = 64


@dataclass(frozen=True)
class Layout:
    name: str
    model: str
    prefill_tp: int
    decode_tp: int
    kv_layout: str = "HND"
    decode_dcp: int = 1

    def planner(self, layers: int | None = None) -> PDTransferPlanner:
        shape = replace(ModelShape.preset(self.model), page_size=PAGE)
        if layers is not None:
            shape = replace(shape, layer_kinds=shape.model_layers[:layers])
        prefill, decode = model_buffer_layouts(
            shape,
            self.prefill_tp,
            self.decode_tp,
            self.kv_layout,  # type: ignore[arg-type]
            decode_dcp=self.decode_dcp,
        )
        return PDTransferPlanner(
            prefill_layout=ParallelLayout("prefill", self.prefill_tp),
            decode_layout=ParallelLayout("decode", self.decode_tp, dcp_size=self.decode_dcp),
            prefill_buffers=prefill,
            decode_buffers=decode,
        )


LAYOUTS = [
    Layout("token-major TP 8 -> 2", "llama-3-70b", 8, 2, "NHD"),
    Layout("MLA DCP 8, interleave 1", "deepseek-v3", 8, 8, decode_dcp=8),
    Layout("head-major TP 2 -> 8", "llama-3-70b", 2, 8),
]


class Pair:
    """Prefill rank -> decode rank 0 over real memory: caches, the request's pages, plans."""

    def __init__(self, layout: Layout, layers: int) -> None:
        planner = self.planner = layout.planner(layers)
        sources = planner.transfer_fragments(0, num_tokens=TOKENS)
        prefill_rank = min(sources)
        pages = TOKENS // PAGE
        rng = np.random.default_rng(0)
        self.src = [
            rng.integers(0, 256, b.item_stride_bytes * pages, dtype=np.uint8)
            for b in planner.prefill_buffers
        ]
        self.dst = [
            np.ones(b.item_stride_bytes * pages, dtype=np.uint8) for b in planner.decode_buffers
        ]
        self.prepared = PreparedTransfer(
            sources[prefill_rank],
            [a.ctypes.data for a in self.src],
            [a.ctypes.data for a in self.dst],
            src_limits=[a.nbytes for a in self.src],
            dst_limits=[a.nbytes for a in self.dst],
        )
        tables = rng.permutation(pages), rng.permutation(pages)
        if planner.token_maps:
            layouts = (planner.prefill_layout, planner.decode_layout)
            ranks = (prefill_rank, 0)
            self.slots = tuple(
                token_slots(
                    tables[side],
                    PAGE,
                    TOKENS,
                    layout=layouts[side],
                    rank=ranks[side],
                )
                for side in (0, 1)
            )
            self.direct = lambda: self.prepared.token_descriptors(*self.slots)
            self.plan = lambda: self.prepared.token_staging_plan(*self.slots)
        else:
            self.direct = lambda: self.prepared.descriptors(*tables)
            self.plan = lambda: self.prepared.staging_plan(*tables)


def copy_limit(nbytes: int, repeat: int) -> float:
    """Seconds numpy.copyto takes for `nbytes` between two touched arrays."""
    a, b = np.ones(nbytes, dtype=np.uint8), np.zeros(nbytes, dtype=np.uint8)
    return best_of(lambda: np.copyto(b, a), repeat)[0]


class Nixl:
    """Two NIXL agents in this process (UCX, DRAM): the writer's and the target's memory are
    registered first, then the writer learns the target's metadata."""

    count = 0

    def __init__(self, writer: list[np.ndarray], target: list[np.ndarray]) -> None:
        os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
        from pd_transfer import NixlEngine

        Nixl.count += 1
        self.writer = NixlEngine(f"bench-writer-{Nixl.count}")
        self.target = NixlEngine(f"bench-target-{Nixl.count}")
        for engine, arrays in ((self.writer, writer), (self.target, target)):
            for a in arrays:
                engine.register(a.ctypes.data, a.nbytes)
        self.peer = self.target.address

    def write(self, d: TransferDescriptors) -> float:
        started = time.perf_counter()
        status = self.writer.write(self.peer, d.src_addrs, d.dst_addrs, d.lengths)
        assert status == 0, "NIXL transfer failed"
        return time.perf_counter() - started


def calibrate(repeat: int) -> tuple[CostModel, dict[str, float]]:
    """The model's figures measured here (see the module docstring)."""
    big = 64 << 20
    copy_s = copy_limit(big, repeat)
    copy_rate = big / copy_s
    # Host segments: a pack of 100,000 64-byte runs, 128 bytes apart at the source.
    from pdplan import BufferKind, TransferFragment

    segments = 100_000
    source = np.ones(segments * 128, dtype=np.uint8)
    fragment = TransferFragment(0, BufferKind.TARGET_K, 0, 0, 128, 64, 0, 0, 64)
    strided = PreparedTransfer([fragment], [source.ctypes.data], [0], src_limits=[source.nbytes])
    plan = strided.staging_plan(np.arange(segments), np.arange(segments))
    staging = np.zeros(plan.staging_bytes, dtype=np.uint8)
    pack_s = best_of(lambda: plan.pack(staging), repeat)[0]
    tiny = strided.staging_plan([0], [0])
    one = np.zeros(64, dtype=np.uint8)
    call_s = best_of(lambda: tiny.pack(one), 50)[0]
    per_segment = max(0.0, (pack_s - call_s - plan.staging_bytes / copy_rate) / segments)
    # The engine: one large descriptor for its bandwidth, many small ones for its cost each.
    a, b = np.ones(big, dtype=np.uint8), np.zeros(big, dtype=np.uint8)
    nixl = Nixl([a], [b])
    one_big = TransferDescriptors(
        np.array([a.ctypes.data], np.uint64),
        np.array([b.ctypes.data], np.uint64),
        np.array([big], np.uint64),
    )
    wire_s = min(nixl.write(one_big) for _ in range(repeat))
    offsets = np.arange(segments, dtype=np.uint64) * np.uint64(64)
    small = TransferDescriptors(
        a.ctypes.data + offsets, b.ctypes.data + offsets, np.full(segments, 64, np.uint64)
    )
    small_s = min(nixl.write(small) for _ in range(max(2, repeat // 2)))
    figures = {
        "copy_bytes_per_s": copy_rate,
        "per_segment_s": per_segment,
        "per_copy_s": call_s,
        "network_bytes_per_s": big / wire_s,
        "per_descriptor_s": small_s / segments,
    }
    return CostModel(**figures), figures


def request_rows() -> list[str]:
    rows = []
    model = CostModel()
    for layout in LAYOUTS:
        pairs = list(request_pairs(layout.planner(), TOKENS, model))
        direct = sum(p.descriptors for p in pairs)
        staged = sum(p.estimate.wire_descriptors for p in pairs)
        nbytes = sum(p.bytes for p in pairs)
        choices = {p.estimate.choice for p in pairs}
        e = pairs[0].estimate
        rows.append(
            f"| {layout.name} | {len(pairs)} | {direct:,} | {nbytes // direct:,} | {staged:,} | "
            f"{direct / staged:,.0f}× | {fmt(e.direct_s)} | {fmt(e.staging_s)} | "
            f"{' / '.join(sorted(choices))} |"
        )
    return rows


def measure_pair(layout: Layout, layers: int, model: CostModel, repeat: int) -> tuple[str, str]:
    """One layout's host-copy row and engine row."""
    pair = Pair(layout, layers)
    build_s, plan = best_of(pair.plan, 3)
    assert isinstance(plan, StagingPlan)
    n = plan.staging_bytes
    src_staging = np.ones(n, dtype=np.uint8)
    dst_staging = np.ones(n, dtype=np.uint8)
    pack_s = best_of(lambda: plan.pack(src_staging), repeat)[0]
    unpack_s = best_of(lambda: plan.unpack(dst_staging), repeat)[0]
    copy_s = copy_limit(n, repeat)
    e = model.estimate_plan(plan)
    host = (
        f"| {layout.name} | {n / 2**20:,.0f} MiB | {plan.num_gather_descriptors:,} / "
        f"{plan.num_scatter_descriptors:,} | {fmt(build_s)} | {fmt(pack_s)} "
        f"({n / pack_s / 1e9:.1f} GB/s) | {fmt(unpack_s)} ({n / unpack_s / 1e9:.1f} GB/s) | "
        f"{fmt(copy_s)} ({n / copy_s / 1e9:.1f} GB/s) | {copy_s / pack_s:.2f}× / "
        f"{copy_s / unpack_s:.2f}× | {fmt(e.gather_s)} / {fmt(e.scatter_s)} |"
    )
    # The engine: direct descriptors against gather + one descriptor + scatter.
    nixl = Nixl([*pair.src, src_staging], [*pair.dst, dst_staging])
    direct = pair.direct()
    direct_s = min(nixl.write(direct) for _ in range(3))
    transfer = plan.wire_descriptors(src_staging.ctypes.data, dst_staging.ctypes.data)

    def staged() -> float:
        started = time.perf_counter()
        plan.pack(src_staging)
        nixl.write(transfer)
        plan.unpack(dst_staging)
        return time.perf_counter() - started

    staged_s = min(staged() for _ in range(3))
    # Both ways leave the same bytes: the staged run's caches against a direct run's.
    got = [a.copy() for a in pair.dst]
    for a in pair.dst:
        a[:] = 1
    nixl.write(direct)
    assert all(np.array_equal(g, a) for g, a in zip(got, pair.dst)), layout.name
    measured = "staging" if staged_s < direct_s else "direct"
    engine = (
        f"| {layout.name} | {direct.num_descriptors:,} | {fmt(e.direct_s)} | {fmt(direct_s)} "
        f"| {fmt(e.staging_s)} | {fmt(staged_s)} | {e.choice} | {measured} |"
    )
    return host, engine


def harness_cases(pages: int, layers: int) -> list[Any]:
    """The three layouts at the end-to-end harness's scale: `pages` 64-token pages, `layers`
    layers, one process a side, every rank pair of the request."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from pd_transfer import Buffer, BufferKind, Context, Scenario, Tokens, kv_cache

    rng = np.random.default_rng(1)
    shuffled = {
        "capacity_pages": pages,
        "src_pages": tuple(rng.permutation(pages).tolist()),
        "dst_pages": tuple(rng.permutation(pages).tolist()),
    }
    head = PAGE * 128 * 2  # one head of a page: 64 tokens x 128 bf16
    latent = [
        Buffer(i, BufferKind.TARGET_K, "replicated", 1, 576 * 2, page_sizes=(PAGE, PAGE), layer=i)
        for i in range(layers)
    ]
    tables = tuple(rng.permutation(pages).tolist()), tuple(rng.permutation(pages).tolist())
    tokens = Tokens(pages * PAGE, *tables, (0, pages * PAGE))
    return [
        Scenario("nhd", 8, 2, kv_cache(layers, 8, head, rows=PAGE), **shuffled),
        Scenario(
            "dcp", 8, 8, tuple(latent), capacity_pages=pages, tokens=tokens,
            decode_context=Context(dcp=8),
        ),
        Scenario("hnd", 2, 8, kv_cache(layers, 8, head), **shuffled),
    ]  # fmt: skip


def mooncake_rows(pages: int, layers: int, model: CostModel) -> list[str]:
    """Direct against staged through Mooncake (TCP on 127.0.0.1, one process a side), timed
    by the harness: building and writing on the prefill side, plus planning and unpacking on
    the decode side when staged."""
    from pd_transfer import run_in_processes

    rows = []
    for layout, case in zip(LAYOUTS, harness_cases(pages, layers)):
        direct = run_in_processes(case, "mooncake", per_side=True)
        staged = run_in_processes(replace(case, staging=True), "mooncake", per_side=True)
        assert direct.mismatches == [] and staged.mismatches == [], layout.name
        faster = "staging" if staged.seconds < direct.seconds else "direct"
        rows.append(
            f"| {layout.name} | {direct.bytes / 2**20:,.0f} MiB | {direct.descriptors:,} | "
            f"{staged.descriptors:,} | {fmt(direct.seconds)} | {fmt(staged.seconds)} | {faster} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8, help="layers of the real-memory pair")
    parser.add_argument("--repeat", type=int, default=5, help="best of this many runs")
    parser.add_argument(
        "--mooncake-pages", type=int, default=64, help="64-token pages of the Mooncake runs"
    )
    args = parser.parse_args()
    model, figures = calibrate(args.repeat)
    rows = [measure_pair(layout, args.layers, model, args.repeat) for layout in LAYOUTS]
    host, engine = [row[0] for row in rows], [row[1] for row in rows]
    defaults = CostModel()
    lines = [
        f"One {TOKENS:,}-token request, 64-token pages, scattered.",
        "",
        "**Descriptors a request takes** (the whole model; the default cost model: "
        f"{defaults.per_descriptor_s * 1e6:g} µs a descriptor, "
        f"{defaults.network_bytes_per_s * 8 / 1e9:g} Gb/s, GPU copies at "
        f"{defaults.copy_bytes_per_s / 1e9:g} GB/s + {defaults.per_copy_s * 1e6:g} µs):",
        "",
        "| layout | rank pairs | direct descriptors | B a descriptor | staged (transfer) "
        "descriptors | fewer | direct, a pair (model) | staged, a pair (model) | choice |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        *request_rows(),
        "",
        f"**Host pack and unpack** (one pair, the first {args.layers} layers, real memory; "
        f"best of {args.repeat}; 2 threads above 4 MiB):",
        "",
        "| layout | staged bytes | gather / scatter descriptors | plan build | pack | unpack "
        "| numpy.copyto, same bytes | copy time / pack, / unpack | model: gather / scatter |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *host,
        "",
        "**The model calibrated here, beside NIXL** (UCX, DRAM to DRAM, two agents in one "
        "process): copies at "
        f"{figures['copy_bytes_per_s'] / 1e9:.1f} GB/s + {figures['per_segment_s'] * 1e9:.1f} ns "
        f"a segment + {figures['per_copy_s'] * 1e6:.1f} µs a call; NIXL "
        f"{figures['per_descriptor_s'] * 1e6:.2f} µs a descriptor, "
        f"{figures['network_bytes_per_s'] / 1e9:.1f} GB/s:",
        "",
        "| layout | direct descriptors | direct (model) | direct (NIXL) | staged (model) "
        "| staged (NIXL: pack + 1 descriptor + unpack) | model's choice | faster measured |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
        *engine,
        "",
        f"**Mooncake** (TCP on 127.0.0.1, one process a side; every rank pair of a "
        f"{args.mooncake_pages * PAGE:,}-token request over the first 2 layers; the harness's "
        "times: building and writing, plus planning and unpacking when staged):",
        "",
        "| layout | bytes | direct descriptors | staged descriptors | direct | staged "
        "| faster measured |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
        *mooncake_rows(args.mooncake_pages, 2, model),
    ]
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(exist_ok=True)
    provenance.write("staging.md", text)
    print(text)


if __name__ == "__main__":
    main()

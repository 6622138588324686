"""A pairing's cost of one request (``pdplan.Pairing``, ``pdplan.transfer_cost``, ``pdplan
cost``) against planning the request: its real descriptors over random scattered page tables,
built the way a runtime builds them, and the bytes a decode rank's cache holds."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pdplan import (
    MODEL_PRESETS,
    CostModel,
    ModelShape,
    Pairing,
    ParallelLayout,
    PreparedTransfer,
    StagingCounts,
    UnsupportedPDLayoutError,
    token_slots,
    transfer_cost,
    transfer_descriptors,
)
from pdplan.cli import main

BASE = 1 << 40


def scattered(rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` distinct even page ids in random order: no page beside another."""
    return 2 * rng.choice(4 * count + 4, size=count, replace=False).astype(np.int64)


def pairing_or_none(
    model: str, prefill_tp: int, decode_tp: int, prefill_cp: int = 1, **kw: Any
) -> Pairing | None:
    try:
        prefill = ParallelLayout("prefill", prefill_tp * prefill_cp, cp_size=prefill_cp)
        return Pairing(model, prefill, ParallelLayout("decode", decode_tp), **kw)
    except UnsupportedPDLayoutError:
        return None


def planned(
    pairing: Pairing, tokens: int, prefix: int, seed: int
) -> dict[tuple[int, int], tuple[int, int]]:
    """Every pair's (descriptors, bytes), from the request's own descriptors over random
    scattered pages: by page ids where the two sides' pages pair, else by slot maps."""
    rng = np.random.default_rng(seed)
    planner = pairing.planner
    kv = [b.buffer_index for b in planner.prefill_buffers if b.is_token_indexed]
    state = [b.buffer_index for b in planner.prefill_buffers if not b.is_token_indexed]
    sizes = pairing.page_sizes
    counts = [math.ceil(tokens / s) for s in sizes]
    capacity = 8 * max(counts) + 8
    src_bases = [BASE * (i + 1) for i in range(len(planner.prefill_buffers))]
    dst_bases = [BASE * (i + 1) for i in range(len(planner.decode_buffers))]
    src_limits = [b.item_stride_bytes * capacity for b in planner.prefill_buffers]
    dst_limits = [b.item_stride_bytes * capacity for b in planner.decode_buffers]
    tables = [scattered(rng, c) for c in counts]
    out = {}
    for rank in range(planner.decode_layout.world_size):
        if planner.decode_layout.rank_coordinates(rank).dp_group != 0:
            continue
        for source, fragments in planner.transfer_fragments(rank, num_tokens=tokens).items():
            n = total = 0
            kv_fragments = [f for f in fragments if f.buffer_index in kv]
            if planner.token_maps:
                layouts = (planner.prefill_layout, planner.decode_layout)
                src = token_slots(tables[0], sizes[0], tokens, layout=layouts[0], rank=source)
                dst = token_slots(tables[1], sizes[1], tokens, layout=layouts[1], rank=rank).copy()
                dst[:prefix] = -1
                prepared = PreparedTransfer(
                    fragments, src_bases, dst_bases, src_limits=src_limits, dst_limits=dst_limits
                )
                d = prepared.token_descriptors(src, dst, buffers=kv)
            else:
                first = prefix // sizes[0]
                d = transfer_descriptors(
                    kv_fragments, src_bases, dst_bases, tables[0][first:], tables[1][first:],
                    src_limits=src_limits, dst_limits=dst_limits,
                )  # fmt: skip
            n, total = d.num_descriptors, d.total_bytes
            state_fragments = [f for f in fragments if f.buffer_index in state]
            if state_fragments:
                pages = [int(rng.integers(0, capacity))], [int(rng.integers(0, capacity))]
                s = transfer_descriptors(
                    state_fragments, src_bases, dst_bases, *pages,
                    src_limits=src_limits, dst_limits=dst_limits,
                )  # fmt: skip
                n, total = n + s.num_descriptors, total + s.total_bytes
            out[(rank, source)] = (n, total)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(MODEL_PRESETS),
    prefill_tp=st.sampled_from([1, 2, 4, 8]),
    decode_tp=st.sampled_from([1, 2, 4]),
    prefill_cp=st.sampled_from([1, 1, 2]),
    page_sizes=st.sampled_from([(16, 16), (16, 32), (32, 16), (64, 16), (16, 16)]),
    kv_layout=st.sampled_from(["HND", "NHD"]),
    tokens=st.integers(1, 700),
    prefix_share=st.floats(0, 1),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_request_costs_what_planning_it_builds(
    model: str,
    prefill_tp: int,
    decode_tp: int,
    prefill_cp: int,
    page_sizes: tuple[int, int],
    kv_layout: str,
    tokens: int,
    prefix_share: float,
    seed: int,
) -> None:
    pairing = pairing_or_none(
        model, prefill_tp, decode_tp, prefill_cp, prefill_page_size=page_sizes[0],
        decode_page_size=page_sizes[1], kv_layout=kv_layout,
    )  # fmt: skip
    assume(pairing is not None)
    assert pairing is not None
    prefix = int(tokens * prefix_share)
    cost = pairing.cost(tokens, decode_prefix=prefix)
    want = planned(pairing, tokens, prefix, seed)
    got = {(p.decode_rank, p.prefill_rank): (p.descriptors, p.bytes) for p in cost.pairs}
    assert got == want
    assert cost.by == ("slots" if pairing.planner.token_maps else "pages")
    readers: dict[int, int] = {}
    for (_, source), (_, nbytes) in want.items():
        readers[source] = readers.get(source, 0) + (nbytes > 0)
    assert cost.largest_fanout == max(readers.values(), default=0)


@pytest.mark.parametrize(
    "model", ["llama-3-70b", "qwen3-next-80b-a3b", "deepseek-v3", "jamba-1.5-mini"]
)
@pytest.mark.parametrize("prefill_tp", [1, 2, 8])
def test_one_decode_rank_receives_its_whole_cache_of_the_moved_pages(
    model: str, prefill_tp: int
) -> None:
    # Decode TP 1 holds every layer's every head: it receives, for each page the prefix does
    # not cover, every byte a page of its cache keeps, and every state once.
    shape = ModelShape.preset(model)
    pairing = Pairing(model, ParallelLayout("prefill", prefill_tp), ParallelLayout("decode", 1))
    tokens, prefix = 5000, 1000
    cost = pairing.cost(tokens, decode_prefix=prefix)
    pages = math.ceil(tokens / shape.page_size) - prefix // shape.page_size
    per_token = sum(k.token_bytes * len(k.layers) for k in shape.summary())
    state = sum(k.state_bytes * len(k.layers) for k in shape.summary())
    assert cost.bytes == pages * shape.page_size * per_token + state
    assert cost.moved_tokens == tokens - (prefix // shape.page_size) * shape.page_size


def test_the_demo_request_by_hand() -> None:
    # Llama-3-70B, TP 8 -> 2, 32k tokens in 16-token pages: each prefill rank holds one KV
    # head; a decode rank holds four, from four prefill ranks. A page of one head is one
    # head-major run per K and V per layer: 160 descriptors a page a pair, 2048 pages, 8 pairs.
    cost = transfer_cost(
        "llama-3-70b", ParallelLayout("prefill", 8), ParallelLayout("decode", 2), tokens=32768
    )
    assert cost.descriptors == 8 * 2048 * 160
    assert cost.bytes == 2048 * 80 * 2 * 8 * 128 * 2 * 16
    assert cost.largest_fanout == 1
    assert len(cost.pairs) == 8
    half = transfer_cost(
        "llama-3-70b", ParallelLayout("prefill", 8), ParallelLayout("decode", 2), tokens=32768,
        decode_prefix=16384 + 5,
    )  # fmt: skip
    assert half.descriptors == 8 * 1024 * 160
    assert half.moved_tokens == 16384


def test_the_time_is_the_busiest_rank_the_cheaper_way() -> None:
    # One pair: the request's time is that pair's, direct or staged, whichever the model
    # finds cheaper; a staging plan built from the real descriptors gives the counts.
    model = CostModel(per_descriptor_s=1e-6)
    pairing = Pairing(
        "llama-3-8b", ParallelLayout("prefill", 1), ParallelLayout("decode", 1), cost_model=model
    )
    cost = pairing.cost(1000)
    planner = pairing.planner
    fragments = planner.transfer_fragments(0)[0]
    pages = scattered(np.random.default_rng(1), math.ceil(1000 / 16))
    bases = [BASE * (i + 1) for i in range(len(planner.prefill_buffers))]
    limits = [b.item_stride_bytes * 1024 for b in planner.prefill_buffers]
    plan = PreparedTransfer(
        fragments, bases, bases, src_limits=limits, dst_limits=limits
    ).staging_plan(pages, pages)
    estimate = model.estimate_plan(plan)
    assert cost.seconds == pytest.approx(min(estimate.direct_s, estimate.staging_s))
    assert isinstance(plan.counts, StagingCounts)


@pytest.mark.parametrize(
    ("tokens", "prefix", "says"),
    [
        (0, 0, "tokens must be an int of at least 1"),
        (10, 11, "cannot exceed"),
        (10, -1, "decode_prefix must be an int of at least 0"),
        (True, 0, "tokens must be an int"),
        (10.0, 0, "tokens must be an int"),
        (10**15, 0, "MAX_TOKENS"),
    ],
)
def test_a_request_that_is_no_request_is_refused(tokens: Any, prefix: Any, says: str) -> None:
    pairing = Pairing("llama-3-8b", ParallelLayout("prefill", 2), ParallelLayout("decode", 1))
    with pytest.raises(UnsupportedPDLayoutError, match=says):
        pairing.cost(tokens, decode_prefix=prefix)


def test_a_pairing_refuses_what_it_cannot_plan() -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="decode_dp_group"):
        Pairing(
            "llama-3-8b",
            ParallelLayout("prefill", 2),
            ParallelLayout("decode", 1),
            decode_dp_group=1,
        )
    with pytest.raises(UnsupportedPDLayoutError, match="ModelShape"):
        Pairing(42, ParallelLayout("prefill", 2), ParallelLayout("decode", 1))  # type: ignore[arg-type]
    with pytest.raises(UnsupportedPDLayoutError, match="cost_model must be a CostModel"):
        Pairing(
            "llama-3-8b", ParallelLayout("prefill", 2), ParallelLayout("decode", 1), cost_model=1e-6
        )  # type: ignore[arg-type]
    with pytest.raises(UnsupportedPDLayoutError, match="decode_dp_group"):
        Pairing(
            "llama-3-8b",
            ParallelLayout("prefill", 2),
            ParallelLayout("decode", 1),
            decode_dp_group="0",
        )  # type: ignore[arg-type]
    for prefill, decode, says in (
        ("prefill", ParallelLayout("decode", 1), "got 'str'"),
        (ParallelLayout("prefill", 2), None, "got 'NoneType'"),
        (ParallelLayout("decode", 1), ParallelLayout("prefill", 2), "got 'decode'"),
    ):
        with pytest.raises(UnsupportedPDLayoutError, match=says):
            Pairing("llama-3-8b", prefill, decode)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedPDLayoutError, match="no such file"):
        Pairing("no/such/config.json", ParallelLayout("prefill", 2), ParallelLayout("decode", 1))


def test_scattered_page_counts_equal_a_request_over_scattered_pages() -> None:
    pairing = Pairing("gemma-3-27b", ParallelLayout("prefill", 4), ParallelLayout("decode", 2))
    planner = pairing.planner
    fragments = planner.transfer_fragments(0)[0]
    bases = [BASE * (i + 1) for i in range(len(planner.prefill_buffers))]
    limits = [b.item_stride_bytes * 256 for b in planner.prefill_buffers]
    prepared = PreparedTransfer(fragments, bases, bases, src_limits=limits, dst_limits=limits)
    rng = np.random.default_rng(7)
    for pages in (0, 1, 2, 3, 7):
        table = scattered(rng, pages)
        assert prepared.scattered_page_counts(pages) == prepared.staging_counts(table, table)


def test_the_command_prints_the_cost(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--prefill-tp", "8", "--decode-tp", "2", "--model", "llama-3-70b", "--tokens", "32768"]
    assert main(["cost", *flags, "--decode-prefix", "4100", "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["moved_tokens"] == 32768 - 4096
    assert printed["descriptors"] == 8 * (2048 - 256) * 160
    assert printed["bytes"] == (2048 - 256) * 80 * 2 * 8 * 128 * 2 * 16
    assert {(p["decode_rank"], p["prefill_rank"]) for p in printed["pairs"]} == {
        (d, p) for d in range(2) for p in range(4 * d, 4 * d + 4)
    }
    assert main(["cost", *flags]) == 0
    table = capsys.readouterr().out
    assert "2,621,440 descriptors" in table and "largest fanout 1" in table
    assert main(["cost", *flags, "--decode-prefix", "40000"]) == 2
    assert "cannot exceed" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("model", "prefill_tp", "decode_tp", "prefill_cp", "page_sizes"),
    [
        ("gpt-oss-20b", 2, 1, 1, (16, 32)),  # 128-token windows
        ("gemma-3-27b", 4, 2, 1, (32, 16)),  # 1024-token windows
        ("llama-4-scout", 2, 2, 1, (16, 64)),  # 8192-token attention chunks
        ("llama-3-8b", 2, 1, 2, (16, 16)),  # CP 2, round robin
        ("deepseek-v3", 1, 1, 2, (64, 16)),  # MLA, CP 2, pages that differ
    ],
)
@pytest.mark.parametrize(
    ("tokens", "prefix"), [(20011, 0), (20011, 7777), (9000, 8999), (40000, 128)]
)
def test_long_requests_by_slot_maps_cost_what_planning_them_builds(
    model: str,
    prefill_tp: int,
    decode_tp: int,
    prefill_cp: int,
    page_sizes: tuple[int, int],
    tokens: int,
    prefix: int,
) -> None:
    # Long enough that whole periods come out of the middle, past every window and chunk.
    pairing = pairing_or_none(
        model, prefill_tp, decode_tp, prefill_cp, prefill_page_size=page_sizes[0],
        decode_page_size=page_sizes[1],
    )  # fmt: skip
    assert pairing is not None and pairing.planner.token_maps
    cost = pairing.cost(tokens, decode_prefix=prefix)
    got = {(p.decode_rank, p.prefill_rank): (p.descriptors, p.bytes) for p in cost.pairs}
    assert got == planned(pairing, tokens, prefix, seed=tokens + prefix)
    assert cost.by == "slots"


@pytest.mark.parametrize("split", ["interleave", "contiguous", "zigzag"])
def test_decode_context_parallel_shares_cost_what_planning_them_builds(split: str) -> None:
    # DCP dealt by the request's length (contiguous, zigzag) repeats no period: a full walk.
    decode = ParallelLayout("decode", 4, dcp_size=2, cp_split=split)  # type: ignore[arg-type]
    pairing = Pairing("deepseek-v3", ParallelLayout("prefill", 2), decode)
    for tokens, prefix in ((5000, 1000), (5000, 0), (777, 776)):
        cost = pairing.cost(tokens, decode_prefix=prefix)
        got = {(p.decode_rank, p.prefill_rank): (p.descriptors, p.bytes) for p in cost.pairs}
        assert got == planned(pairing, tokens, prefix, seed=tokens)


def test_a_short_request_walks_no_more_than_itself() -> None:
    # Pages of 17 and 19 tokens under 8192-token chunks repeat only every 2.6 M tokens: a
    # 100-token request is counted as it is, not from periods (it took 14 s, and pages of
    # about 2^20 tokens were refused as too many tokens).
    pairing = Pairing(
        "llama-4-scout", ParallelLayout("prefill", 1), ParallelLayout("decode", 1),
        prefill_page_size=17, decode_page_size=19,
    )  # fmt: skip
    cost = pairing.cost(100, decode_prefix=3)
    got = {(p.decode_rank, p.prefill_rank): (p.descriptors, p.bytes) for p in cost.pairs}
    assert got == planned(pairing, 100, 3, seed=1)
    big = Pairing(
        "gemma-3-27b", ParallelLayout("prefill", 1), ParallelLayout("decode", 1),
        prefill_page_size=2**20 - 1, decode_page_size=2**20 - 3,
    )  # fmt: skip
    assert big.cost(100).bytes == planned(big, 100, 0, seed=2)[(0, 0)][1]


def test_the_decode_dp_group_is_the_one_asked_for() -> None:
    decode = ParallelLayout("decode", 4, dp_size=2)
    cost = transfer_cost(
        "llama-3-8b", ParallelLayout("prefill", 2), decode, tokens=64, decode_dp_group=1
    )
    assert cost.decode_dp_group == 1
    assert {p.decode_rank for p in cost.pairs} == {2, 3}

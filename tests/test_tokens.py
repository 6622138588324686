"""Tokens, not pages: slot maps (`token_slots`), plans with token geometry (`token_maps`),
wire format v3 and `PreparedTransfer.token_descriptors`, against brute force and real bytes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pdplan
from pdplan import (
    BufferKind,
    BufferLayout,
    ModelShape,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    UnsupportedPDLayoutError,
    decode_transfer_fragments,
    encode_transfer_fragments,
    model_buffer_layouts,
    token_slots,
    transfer_descriptors,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from pd_transfer import Buffer, Scenario, Tokens, run_in_memory

# ---------------------------------------------------------------------------------------------
# token_slots


def slots_by_hand(table: list[int], size: int, n: int, tokens: range) -> list[int]:
    out = [-1] * n
    for t in tokens:
        out[t] = table[t // size] * size + t % size
    return out


@given(
    st.integers(1, 40),
    st.integers(0, 300),
    st.data(),
)
def test_token_slots_equal_the_definition(size: int, n: int, data: st.DataObject) -> None:
    pages = -(-n // size)
    table = data.draw(st.lists(st.integers(0, 10_000), min_size=pages, max_size=pages + 3))
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    got = token_slots(np.array(table, dtype=np.int32), size, n, tokens=range(start, stop))
    assert got.dtype == np.int64
    assert got.tolist() == slots_by_hand(table, size, n, range(start, stop))
    assert token_slots(table, size, n).tolist() == slots_by_hand(table, size, n, range(n))


def test_token_slots_refuse_what_cannot_be_a_slot_map() -> None:
    window = [-1, -1, 7, 3]  # a window layer holds only the last two pages
    assert token_slots(window, 16, 60, tokens=range(32, 60))[32] == 7 * 16
    cases: list[tuple[dict[str, Any], str]] = [
        (dict(page_table=window, page_size=16, num_tokens=60), "does not hold"),
        (dict(page_table=[0], page_size=16, num_tokens=60), "page table has 1 entries"),
        (dict(page_table=[0, -2], page_size=16, num_tokens=20), "page indices or -1"),
        (dict(page_table=[0], page_size=0, num_tokens=1), "page_size=0"),
        (dict(page_table=[0], page_size=16, num_tokens=1 << 40), "num_tokens"),
        (dict(page_table=[0], page_size=16, num_tokens=4, tokens=range(3, 0, -1)), "ascending"),
        (dict(page_table=[0], page_size=16, num_tokens=4, tokens=range(0, 9)), "inside"),
        (dict(page_table=[0], page_size=16, num_tokens=4, tokens=[0, 1]), "range"),
        (dict(page_table=np.zeros(2, dtype=np.float32), page_size=16, num_tokens=4), "integer"),
        (dict(page_table=[1 << 62], page_size=16, num_tokens=4), "64 bits"),
    ]
    for kwargs, message in cases:
        with pytest.raises(UnsupportedPDLayoutError, match=message):
            token_slots(**kwargs)


# ---------------------------------------------------------------------------------------------
# Plans with token geometry


def kv(
    tp: int, size: int, rows: int = 1, heads: int = 8, token_bytes: int = 256
) -> tuple[BufferLayout, ...]:
    unit = token_bytes * size
    return tuple(
        BufferLayout(
            i,
            kind,
            "kv_head",
            heads,
            size,
            unit,
            heads // min(tp, heads) * unit,
            max(1, tp // heads),
            rows,
        )
        for i, kind in enumerate((BufferKind.TARGET_K, BufferKind.TARGET_V))
    )


def planner(
    ptp: int, dtp: int, sizes: tuple[int, int], token_major: bool = False, **kwargs: Any
) -> PDTransferPlanner:
    return PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", ptp),
        decode_layout=ParallelLayout("decode", dtp),
        prefill_buffers=kv(ptp, sizes[0], sizes[0] if token_major else 1),
        decode_buffers=kv(dtp, sizes[1], sizes[1] if token_major else 1),
        **kwargs,
    )


def test_page_sizes_that_differ_turn_token_maps_on_and_encode_as_v3() -> None:
    p = planner(8, 2, (16, 64))
    assert p.token_maps
    p.verify()
    fragments = p.transfer_fragments(1)[5]
    f = fragments[0]
    assert (f.src_page_size, f.dst_page_size, f.token_runs, f.token_run_bytes) == (16, 64, 1, 256)
    version, payload = encode_transfer_fragments(fragments)
    assert version == b"3"
    assert decode_transfer_fragments(version, payload) == fragments
    assert pdplan.TRANSFER_PLAN_READABLE_VERSIONS == (1, 2, 3, 4, 5, 6)
    # Equal page sizes keep token maps off by default, and v1 frames.
    default = planner(8, 2, (16, 16))
    assert not default.token_maps
    assert encode_transfer_fragments(default.transfer_fragments(1)[5])[0] == b"1"
    asked = planner(8, 2, (16, 16), token_maps=True)
    assert asked.token_maps and encode_transfer_fragments(asked.transfer_fragments(1)[5])[0] == b"3"
    # The page fields of an equal-size plan are untouched by token maps.
    for a, b in zip(asked.transfer_fragments(1)[5], default.transfer_fragments(1)[5]):
        assert (a.src_byte_offset, a.dst_byte_offset, a.bytes_per_page) == (
            b.src_byte_offset,
            b.dst_byte_offset,
            b.bytes_per_page,
        )


def test_pairs_that_cannot_move_by_token_are_refused_with_the_reason() -> None:
    layouts = dict(
        prefill_layout=ParallelLayout("prefill", 8), decode_layout=ParallelLayout("decode", 2)
    )
    # Equal unit bytes over different page sizes: tokens of different sizes (the reference pairs
    # these page to page, which is wrong).
    wrong = tuple(
        BufferLayout(b.buffer_index, b.buffer_kind, "kv_head", 8, 64, 4096, 4 * 4096)
        for b in kv(2, 16)
    )
    with pytest.raises(UnsupportedPDLayoutError, match="bytes of one token differ"):
        PDTransferPlanner(**layouts, prefill_buffers=kv(8, 16), decode_buffers=wrong)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedPDLayoutError, match="stored differently"):
        PDTransferPlanner(**layouts, prefill_buffers=kv(8, 16), decode_buffers=kv(2, 64, rows=128))  # type: ignore[arg-type]
    # One plane each: head-major prefill pages into token-major decode pages move by token.
    PDTransferPlanner(
        **layouts, prefill_buffers=kv(8, 16), decode_buffers=kv(2, 64, rows=64)
    ).verify()  # type: ignore[arg-type]
    odd_rows = kv(8, 16, rows=8)
    with pytest.raises(UnsupportedPDLayoutError, match="neither 1"):
        PDTransferPlanner(
            **layouts, prefill_buffers=odd_rows, decode_buffers=kv(2, 16, rows=8), token_maps=True
        )  # type: ignore[arg-type]

    def uneven(tp: int) -> tuple[BufferLayout, ...]:  # 1000-byte units: no 16-token slices
        return (BufferLayout(0, BufferKind.TARGET_K, "kv_head", 8, 16, 1000, 8 // tp * 1000),)

    with pytest.raises(UnsupportedPDLayoutError, match="divisible by page_size"):
        PDTransferPlanner(
            **layouts, prefill_buffers=uneven(8), decode_buffers=uneven(2), token_maps=True
        )  # type: ignore[arg-type]
    assert (
        PDTransferPlanner(**layouts, prefill_buffers=uneven(8), decode_buffers=uneven(2)).verify()
        is None
    )  # type: ignore[arg-type, func-returns-value]


def test_wire_v3_is_strict() -> None:
    fragments = planner(2, 8, (64, 16)).transfer_fragments(5)[1]
    version, payload = encode_transfer_fragments(fragments)
    text = payload.decode()
    with pytest.raises(UnsupportedPDLayoutError):
        decode_transfer_fragments(b"2", payload)  # v2 frames carry no token keys
    for broken in (
        text.replace(',"dst_token_run_stride_bytes":0', ""),
        text.replace('"token_runs":1', '"token_runs":0'),
        text.replace('"src_page_size":64', '"src_page_size":2097152'),
        text.replace('"dst_token_stride_bytes":256', '"dst_token_stride_bytes":1'),
    ):
        assert broken != text
        with pytest.raises(UnsupportedPDLayoutError):
            decode_transfer_fragments(version, broken.encode())


# ---------------------------------------------------------------------------------------------
# token_descriptors


def prepared_for(
    p: PDTransferPlanner, decode_rank: int, prefill_rank: int, pages: int = 64
) -> tuple[PreparedTransfer, tuple[Any, ...]]:
    fragments = p.transfer_fragments(decode_rank)[prefill_rank]
    src = [b.item_stride_bytes * pages for b in p.prefill_buffers]
    dst = [b.item_stride_bytes * pages for b in p.decode_buffers]
    src_bases = [(1 << 32) * (i + 1) for i in range(len(src))]
    dst_bases = [(1 << 40) * (i + 1) for i in range(len(dst))]
    prepared = PreparedTransfer(fragments, src_bases, dst_bases, src_limits=src, dst_limits=dst)
    return prepared, (fragments, src_bases, dst_bases, src, dst)


@pytest.mark.parametrize("token_major", [False, True])
def test_equal_page_sizes_give_the_page_path_descriptors(token_major: bool) -> None:
    p = planner(8, 2, (16, 16), token_major=token_major, token_maps=True)
    prepared, _ = prepared_for(p, 1, 5)
    rng = np.random.default_rng(7)
    src_pages, dst_pages = rng.permutation(64)[:20], rng.permutation(64)[:20]
    n = 20 * 16
    by_pages = prepared.descriptors(src_pages, dst_pages)
    by_tokens = prepared.token_descriptors(
        token_slots(src_pages, 16, n), token_slots(dst_pages, 16, n)
    )
    for got, want in zip(by_tokens, by_pages):
        assert np.array_equal(got, want)
    # Contiguous pages merge the same way too.
    runs = np.arange(10, 30)
    by_pages = prepared.descriptors(runs, runs)
    by_tokens = prepared.token_descriptors(token_slots(runs, 16, n), token_slots(runs, 16, n))
    assert by_tokens.num_descriptors == by_pages.num_descriptors
    assert by_tokens.total_bytes == by_pages.total_bytes


def test_token_descriptors_refuse_bad_requests_and_the_page_path_refuses_token_plans() -> None:
    p = planner(8, 2, (16, 64))
    prepared, (fragments, src_bases, dst_bases, _src, _dst) = prepared_for(p, 1, 5)
    slots = np.arange(100)
    cases: list[tuple[tuple[Any, Any], str]] = [
        ((slots, slots[:-1]), "request's length"),
        ((slots.astype(np.float64), slots), "integer"),
        ((slots - 2, slots), "is -2"),
        ((slots + 64 * 16, slots), "past its limit"),
        ((slots, slots + 64 * 64), "past its limit"),
    ]
    for args, message in cases:
        with pytest.raises(UnsupportedPDLayoutError, match=message):
            prepared.token_descriptors(*args)
    pages = np.arange(4)
    with pytest.raises(UnsupportedPDLayoutError, match="token_descriptors"):
        prepared.descriptors(pages, pages)
    with pytest.raises(UnsupportedPDLayoutError, match="token_descriptors"):
        transfer_descriptors(fragments, src_bases, dst_bases, pages, pages)
    with pytest.raises(UnsupportedPDLayoutError, match="token_descriptors"):
        prepared.nixl_prepped_lists(64, 64)
    # A plan made without token maps names the option.
    plain, _ = prepared_for(planner(8, 2, (16, 16)), 1, 5)
    with pytest.raises(UnsupportedPDLayoutError, match="token_maps=True"):
        plain.token_descriptors(slots, slots)


def test_state_buffers_must_be_left_out_of_token_descriptors() -> None:
    shape = ModelShape.preset("nemotron-h-8b")
    prefill, decode = model_buffer_layouts(shape, 4, 2)
    p = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 4),
        decode_layout=ParallelLayout("decode", 2),
        prefill_buffers=prefill,
        decode_buffers=decode,
        token_maps=True,
    )
    p.verify()
    prepared, _ = prepared_for(p, 0, 1, pages=8)
    slots = np.arange(32)
    with pytest.raises(UnsupportedPDLayoutError, match="state buffer"):
        prepared.token_descriptors(slots, slots)
    kv_indices = [b.buffer_index for b in prefill if b.logical_axis != "state_channel"]
    state = [b.buffer_index for b in prefill if b.logical_axis == "state_channel"]
    assert kv_indices and state
    assert prepared.token_descriptors(slots, slots, buffers=kv_indices).num_descriptors > 0
    assert prepared.descriptors([1], [2], buffers=state).num_descriptors > 0


def test_from_frames_prepares_token_plans() -> None:
    p = planner(2, 8, (64, 16))
    prepared, (fragments, src_bases, dst_bases, src, dst) = prepared_for(p, 5, 1)
    version, payload = encode_transfer_fragments(fragments)
    framed = PreparedTransfer.from_frames(
        version, payload, src_bases, dst_bases, src_limits=src, dst_limits=dst
    )
    src_slots = token_slots([5, 2], 64, 100)
    dst_slots = token_slots(list(range(20, 27)), 16, 100)
    for a, b in zip(
        framed.token_descriptors(src_slots, dst_slots),
        prepared.token_descriptors(src_slots, dst_slots),
    ):
        assert np.array_equal(a, b)


# ---------------------------------------------------------------------------------------------
# Any layout: real bytes of labelled numpy caches, each side its own page size and page table


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(
        [(1, 8, 8), (8, 1, 8), (2, 4, 4), (4, 2, 2), (4, 8, 2), (8, 2, 8), (2, 1, 8), (1, 2, 8)]
    ),
    st.sampled_from([(16, 64), (64, 16), (12, 20), (16, 16), (1, 7), (5, 5)]),
    st.sampled_from([(0, 0), (1, 1), (2, 2), (0, 1), (1, 0)]),
    st.sampled_from(["kv_head", "replicated"]),
    st.integers(1, 90),
    st.data(),
)
def test_any_layout_moves_exactly_the_tokens_asked_for(
    tps: tuple[int, int, int],
    sizes: tuple[int, int],
    planes: tuple[int, int],
    axis: str,
    num_tokens: int,
    data: st.DataObject,
) -> None:
    # Head-major and token-major pages face each other at any page sizes, equal ones included
    # (slot maps, not pages, move them then).
    ptp, dtp, heads = tps
    replicas = dict(prefill_replica=max(1, ptp // heads), decode_replica=max(1, dtp // heads))
    if axis == "replicated":
        heads, replicas = 1, {}
    buffer = Buffer(
        0,
        BufferKind.TARGET_K,
        axis,
        heads,
        4,
        padding=4,
        page_sizes=sizes,
        planes=planes[0],
        decode_planes=planes[1],
        **replicas,
    )
    pages = [-(-num_tokens // size) for size in sizes]
    capacity = max(pages) + 2
    src_table = data.draw(st.permutations(range(capacity)))[: pages[0]]
    dst_table = data.draw(st.permutations(range(capacity)))[: pages[1]]
    start = data.draw(st.integers(0, num_tokens - 1))
    stop = data.draw(st.integers(start + 1, num_tokens))
    # Pages of the decode table no moved token touches may be missing (a window's ring).
    first_page = start // sizes[1]
    dst_table = [-1 if i < first_page else page for i, page in enumerate(dst_table)]
    scenario = Scenario(
        "property",
        ptp,
        dtp,
        (buffer,),
        capacity_pages=capacity,
        tokens=Tokens(num_tokens, tuple(src_table), tuple(dst_table), (start, stop)),
        decode_replicas=data.draw(st.sampled_from(["first", "all"])),
    )
    planner = scenario.planner()
    planner.verify()
    outcome = run_in_memory(scenario)
    assert outcome.mismatches == []
    assert outcome.bytes > 0

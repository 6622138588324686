"""transfer_descriptors: equal to the plain Python loop, coalescing, and every refusal."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdplan import (
    BufferKind,
    BufferLayout,
    ParallelLayout,
    PDTransferPlanner,
    TransferDescriptors,
    TransferFragment,
    UnsupportedPDLayoutError,
    decode_transfer_fragments,
    encode_transfer_fragments,
    transfer_descriptors,
)


def tagged_loop(
    fragments: Any, src_bases: Any, dst_bases: Any, src_pages: Any, dst_pages: Any
) -> list[tuple[int, int, int, int]]:
    """What runtimes do today, one tuple per fragment, page pair and row, tagged with the
    buffer it lies in."""
    out = []
    for f in fragments:
        pairs = list(zip(src_pages, dst_pages))
        if f.page_count is not None:
            pairs = pairs[: f.page_count]
        run = f.bytes_per_page // f.rows_per_page
        for sp, dp in pairs:
            for row in range(f.rows_per_page):
                out.append(
                    (
                        int(src_bases[f.buffer_index])
                        + int(sp) * f.src_page_stride_bytes
                        + f.src_byte_offset
                        + row * f.src_row_stride_bytes,
                        int(dst_bases[f.buffer_index])
                        + int(dp) * f.dst_page_stride_bytes
                        + f.dst_byte_offset
                        + row * f.dst_row_stride_bytes,
                        run,
                        f.buffer_index,
                    )
                )
    return out


def python_loop(*request: Any) -> list[tuple[int, int, int]]:
    return [row[:3] for row in tagged_loop(*request)]


def coalesced(rows: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int]]:
    """Neighbours that continue each other on both sides, inside one buffer, merge."""
    out: list[tuple[int, int, int, int]] = []
    for src, dst, length, buffer in rows:
        last = out[-1] if out else None
        if last and last[3] == buffer and last[0] + last[2] == src and last[1] + last[2] == dst:
            out[-1] = (last[0], last[1], last[2] + length, buffer)
        else:
            out.append((src, dst, length, buffer))
    return [row[:3] for row in out]


def rows(d: TransferDescriptors) -> list[tuple[int, int, int]]:
    return list(zip(d.src_addrs.tolist(), d.dst_addrs.tolist(), d.lengths.tolist()))


def frag(
    buffer_index: int = 0,
    src_stride: int = 64,
    dst_stride: int = 128,
    src_off: int = 0,
    dst_off: int = 0,
    length: int = 64,
    page_count: int | None = None,
    rows: tuple[int, int, int] = (1, 0, 0),
) -> TransferFragment:
    """`rows` is (rows_per_page, src row stride, dst row stride); `length` a page's bytes."""
    return TransferFragment(
        buffer_index,
        BufferKind.TARGET_K,
        0,
        1,
        src_stride,
        dst_stride,
        src_off,
        dst_off,
        length,
        page_count,
        *rows,
    )


@st.composite
def requests(draw: Any) -> tuple[Any, ...]:
    buffers = draw(st.integers(1, 4))
    unit = draw(st.sampled_from([1, 8, 64]))
    fragments = []
    for _ in range(draw(st.integers(0, 6))):
        # Token-major pages now and then: rows of `unit`-byte runs, dense or strided.
        rows = draw(st.sampled_from([1, 1, 1, 2, 4]))
        src_row = unit * draw(st.integers(1, 2)) if rows > 1 else 0
        dst_row = unit * draw(st.integers(1, 2)) if rows > 1 else 0
        length = unit * draw(st.integers(0, 1)) * rows
        src_stride = max(unit * draw(st.integers(1, 4)), src_row * rows)
        dst_stride = max(unit * draw(st.integers(1, 4)), dst_row * rows)
        if rows == 1:
            src_reach, dst_reach = length, length
        else:
            src_reach = (rows - 1) * src_row + length // rows
            dst_reach = (rows - 1) * dst_row + length // rows
        fragments.append(
            frag(
                draw(st.integers(0, buffers - 1)),
                src_stride,
                dst_stride,
                draw(st.integers(0, src_stride - src_reach)) if src_stride >= src_reach else 0,
                draw(st.integers(0, dst_stride - dst_reach)) if dst_stride >= dst_reach else 0,
                length,
                draw(st.none() | st.integers(0, 8)),
                (rows, src_row, dst_row),
            )
        )
    pages = draw(st.integers(0, 12))
    src_pages = draw(st.lists(st.integers(0, 30), min_size=pages, max_size=pages))
    dst_pages = draw(st.lists(st.integers(0, 30), min_size=pages, max_size=pages))
    if draw(st.booleans()):  # runs of consecutive pages, the common case
        start = draw(st.integers(0, 10))
        src_pages = list(range(start, start + pages))
        dst_pages = list(range(start + 3, start + 3 + pages))
    bases = [draw(st.integers(0, 2**40)) for _ in range(buffers)]
    dst_bases = [draw(st.integers(0, 2**40)) for _ in range(buffers)]
    dtype = draw(st.sampled_from(["int32", "int64", "list"]))

    def column(values: list[int]) -> Any:
        return values if dtype == "list" else np.array(values, dtype=dtype)

    return (
        fragments,
        np.array(bases, dtype=np.uint64),
        dst_bases,
        column(src_pages),
        column(dst_pages),
    )


@settings(max_examples=300, deadline=None)
@given(requests())
def test_uncoalesced_equals_the_python_loop(request: tuple[Any, ...]) -> None:
    out = transfer_descriptors(*request, coalesce=False)
    assert all(a.dtype == np.uint64 for a in out)
    assert rows(out) == python_loop(*request)


@settings(max_examples=300, deadline=None)
@given(requests())
def test_coalesced_merges_exactly_the_continuing_neighbours(request: tuple[Any, ...]) -> None:
    assert rows(transfer_descriptors(*request)) == coalesced(tagged_loop(*request))


def test_shapes_unpacking_and_the_n_by_3_array() -> None:
    out = transfer_descriptors(
        [frag(), frag(buffer_index=1)],
        [0, 10_000],
        [0, 50_000],
        np.array([0, 2], dtype=np.int32),
        np.array([1, 3]),
        coalesce=False,
    )
    src, dst, lengths = out
    assert out.num_descriptors == 4 and out.total_bytes == 256
    table = out.as_array()
    assert table.shape == (4, 3) and table.dtype == np.uint64 and table.flags.c_contiguous
    assert table[:, 0].tolist() == src.tolist() == [0, 128, 10_000, 10_128]
    assert table[:, 1].tolist() == dst.tolist() == [128, 384, 50_128, 50_384]
    assert lengths.tolist() == [64] * 4


def test_coalescing_needs_both_sides_to_continue() -> None:
    whole = frag(src_stride=64, dst_stride=64, length=64)
    pages = np.arange(4)
    merged = transfer_descriptors([whole], [0], [1000], pages, pages)
    assert rows(merged) == [(0, 1000, 256)]
    only_src = frag(src_stride=64, dst_stride=128, length=64)
    assert transfer_descriptors([only_src], [0], [0], pages, pages).num_descriptors == 4
    # Neighbours from different fragments merge too when they continue each other.
    first, second = frag(length=32), frag(src_off=32, dst_off=32, length=32)
    assert rows(transfer_descriptors([first, second], [0], [0], [0], [0])) == [(0, 0, 64)]
    # A break in the page run starts a new descriptor.
    runs = transfer_descriptors([whole], [0], [0], [0, 1, 2, 7, 8], [0, 1, 2, 3, 4])
    assert rows(runs) == [(0, 0, 192), (448, 192, 128)]


def test_a_fragment_that_writes_nothing_does_not_part_its_neighbours() -> None:
    # Hypothesis found it: a fragment of another buffer limited to no pages sat between two
    # halves of one run, and the halves stayed apart. The descriptors before and after an
    # empty fragment are neighbours; they merge where they continue each other.
    first, second = frag(length=32), frag(src_off=32, dst_off=32, length=32)
    empty = frag(buffer_index=1, page_count=0)
    out = transfer_descriptors([first, empty, second], [0, 4096], [0, 4096], [0], [0])
    assert rows(out) == [(0, 0, 64)]
    zero = frag(dst_off=1, length=0)
    out = transfer_descriptors([zero, empty, zero], [0, 4096], [0, 4096], [0], [0])
    assert rows(out) == coalesced(tagged_loop([zero, empty, zero], [0, 4096], [0, 4096], [0], [0]))


def test_page_count_takes_the_first_pairs() -> None:
    out = transfer_descriptors([frag(page_count=2)], [0], [0], [5, 6, 7], [0, 1, 2], coalesce=False)
    assert out.src_addrs.tolist() == [320, 384]
    out = transfer_descriptors([frag(page_count=0)], [0], [0], [5], [0], coalesce=False)
    assert out.num_descriptors == 0


def test_limits_that_fit_are_accepted_exactly() -> None:
    # Page 3 of a 64-byte stride ends at byte 256: a limit of 256 holds it, 255 does not.
    out = transfer_descriptors(
        [frag(dst_stride=64)], [0], [0], [3], [3], src_limits=[256], dst_limits=[256]
    )
    assert out.num_descriptors == 1
    with pytest.raises(UnsupportedPDLayoutError, match="past its limit of 255"):
        transfer_descriptors([frag(dst_stride=64)], [0], [0], [3], [3], src_limits=[255])
    with pytest.raises(UnsupportedPDLayoutError, match="dst buffer, past its limit"):
        transfer_descriptors([frag(dst_stride=64)], [0], [0], [3], [3], dst_limits=[200])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"src_pages": np.array([0, -1], dtype=np.int32)}, r"src_pages\[1\] = -1 is negative"),
        ({"dst_pages": [0, -2]}, r"dst_pages\[1\] must be a non-negative integer"),
        ({"dst_pages": np.array([0])}, "same length"),
        ({"src_pages": np.array([0.0, 1.0])}, "1-D integer array"),
        ({"src_pages": np.zeros((2, 2), dtype=np.int64)}, "1-D integer array"),
        ({"src_pages": [0, True]}, "non-negative integer"),
        ({"src_base_ptrs": []}, "src_base_ptrs has 0 entries"),
        ({"dst_base_ptrs": [0]}, "dst_base_ptrs has 1 entries"),
        ({"src_base_ptrs": [0, 2**64 - 100]}, "overflows 64 bits"),
        ({"src_pages": [0, 2**62]}, "overflows 64 bits"),
        ({"src_limits": [10**9]}, "src_limits has 1 entries"),
        ({"src_base_ptrs": [0, -5]}, "non-negative integer"),
        ({"fragments": [object()]}, r"fragments\[0\]"),
    ],
)
def test_refusals(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "fragments": [frag(), frag(buffer_index=1)],
        "src_base_ptrs": [0, 4096],
        "dst_base_ptrs": [0, 8192],
        "src_pages": np.array([0, 1]),
        "dst_pages": np.array([2, 3]),
    }
    args.update(kwargs)
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        transfer_descriptors(**args)


def test_too_many_descriptors_are_refused_before_allocating() -> None:
    from pdplan.limits import MAX_DESCRIPTORS

    pages = np.zeros(1 << 16, dtype=np.int64)
    fragments = [frag()] * (MAX_DESCRIPTORS // len(pages) + 1)
    with pytest.raises(UnsupportedPDLayoutError, match="MAX_DESCRIPTORS"):
        transfer_descriptors(fragments, [0], [0], pages, pages, coalesce=False)


def test_fragments_from_the_wire_are_checked_like_any_other() -> None:
    hostile = frag(src_off=10**15)
    version, payload = encode_transfer_fragments([hostile])
    received = decode_transfer_fragments(version, payload)
    with pytest.raises(UnsupportedPDLayoutError, match="past its limit"):
        transfer_descriptors(received, [0], [0], [0], [0], src_limits=[4096], dst_limits=[4096])


def kv(index: int, tp: int) -> BufferLayout:
    unit = 4096
    return BufferLayout(index, BufferKind.TARGET_K, "kv_head", 8, 16, unit, 8 // tp * unit)


def test_identity_plans_get_whole_item_fragments_that_coalesce_per_run() -> None:
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2),
        decode_layout=ParallelLayout("decode", 2),
        prefill_buffers=(kv(0, 2), kv(1, 2)),
        decode_buffers=(kv(0, 2), kv(1, 2)),
    )
    assert planner.plan_for_decode_rank(1).fragments_by_prefill_rank == {}
    by_rank = planner.transfer_fragments(1)
    assert list(by_rank) == [1]
    fragments = by_rank[1]
    assert [f.buffer_index for f in fragments] == [0, 1]
    item = 4 * 4096
    assert all(
        (f.src_byte_offset, f.dst_byte_offset, f.bytes_per_page) == (0, 0, item) for f in fragments
    )
    pages = np.array([3, 4, 5, 9, 10], dtype=np.int32)
    out = transfer_descriptors(fragments, [0, 10**6], [0, 10**7], pages, pages + 1)
    # Two buffers x two runs of contiguous pages.
    assert rows(out) == [
        (3 * item, 4 * item, 3 * item),
        (9 * item, 10 * item, 2 * item),
        (10**6 + 3 * item, 10**7 + 4 * item, 3 * item),
        (10**6 + 9 * item, 10**7 + 10 * item, 2 * item),
    ]


def test_fragmented_plans_give_their_own_fragments() -> None:
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 8),
        decode_layout=ParallelLayout("decode", 2),
        prefill_buffers=(kv(0, 8),),
        decode_buffers=(kv(0, 2),),
    )
    assert (
        planner.transfer_fragments(1) == planner.plan_for_decode_rank(1).fragments_by_prefill_rank
    )
    with pytest.raises(UnsupportedPDLayoutError, match="out of range"):
        planner.transfer_fragments(2)

"""PreparedTransfer: the same descriptors as transfer_descriptors, selections of buffers, frames
parsed once and reused by content, encoded frames reused by identity, NIXL's index form, and
every refusal."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pdplan
from pdplan import (
    DEFAULT_MAX_FRAGMENTS,
    ModelShape,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    TransferFragment,
    UnsupportedPDLayoutError,
    _core,
    encode_transfer_fragments,
    model_buffer_layouts,
    transfer_descriptors,
)

from test_descriptors import coalesced, python_loop, requests, rows, tagged_loop


def llama(kv_layout: str = "HND", prefill_tp: int = 8, decode_tp: int = 2) -> PDTransferPlanner:
    prefill, decode = model_buffer_layouts(
        ModelShape.preset("llama-3-8b"),
        prefill_tp,
        decode_tp,
        kv_layout,  # type: ignore[arg-type]
    )
    return PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", prefill_tp),
        decode_layout=ParallelLayout("decode", decode_tp),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )


PLAN = llama()
FRAGMENTS = PLAN.transfer_fragments(1)[5]
BASES = np.arange(64, dtype=np.uint64) * (1 << 30) + (1 << 40)
LIMITS = np.full(64, 1 << 30, dtype=np.uint64)


@settings(max_examples=300, deadline=None)
@given(requests(), st.booleans())
def test_prepared_descriptors_equal_transfer_descriptors(request: Any, coalesce: bool) -> None:
    fragments, src_bases, dst_bases, src_pages, dst_pages = request
    prepared = PreparedTransfer(fragments, src_bases, dst_bases)
    got = rows(prepared.descriptors(src_pages, dst_pages, coalesce=coalesce))
    expected = coalesced(tagged_loop(*request)) if coalesce else python_loop(*request)
    assert got == expected
    assert got == rows(transfer_descriptors(*request, coalesce=coalesce))
    # Reused for a second request with other pages, it gives that request's descriptors.
    again = prepared.descriptors(dst_pages, src_pages, coalesce=False)
    swapped = (fragments, src_bases, dst_bases, dst_pages, src_pages)
    assert rows(again) == python_loop(*swapped)


@pytest.mark.parametrize(
    "buffers",
    [range(4, 12), range(11, 3, -2), [0, 63, 5], np.array([2, 3], dtype=np.int32), []],
)
def test_a_selection_moves_only_its_buffers_in_fragment_order(buffers: Any) -> None:
    prepared = PreparedTransfer(FRAGMENTS, BASES, BASES)
    pages = np.arange(3)
    chosen = set(int(b) for b in buffers)
    expected = [f for f in FRAGMENTS if f.buffer_index in chosen]
    got = prepared.descriptors(pages, pages, buffers=buffers, coalesce=False)
    assert rows(got) == python_loop(expected, BASES, BASES, pages, pages)


def test_limits_are_checked_per_request() -> None:
    item = FRAGMENTS[0].src_page_stride_bytes
    limits = np.full(64, 10 * item, dtype=np.uint64)  # 10 pages a buffer
    prepared = PreparedTransfer(FRAGMENTS, BASES, BASES, src_limits=limits, dst_limits=limits * 4)
    assert prepared.descriptors([9], [9]).num_descriptors == len(FRAGMENTS)
    with pytest.raises(UnsupportedPDLayoutError, match="past its limit"):
        prepared.descriptors([10], [9])
    with pytest.raises(UnsupportedPDLayoutError, match="same length"):
        prepared.descriptors([1, 2], [1])
    with pytest.raises(UnsupportedPDLayoutError, match="negative"):
        prepared.descriptors(np.array([-1]), np.array([1]))


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((FRAGMENTS, BASES[:3], BASES), {}, "src_base_ptrs has 3 entries"),
        ((FRAGMENTS, BASES, BASES), {"dst_limits": LIMITS[:1]}, "dst_limits has 1 entries"),
        (([object()], BASES, BASES), {}, r"fragments\[0\]"),
        ((FRAGMENTS, "bases", BASES), {}, "src_base_ptrs"),
    ],
)
def test_preparing_refuses_once(args: Any, kwargs: Any, message: str) -> None:
    with pytest.raises(UnsupportedPDLayoutError, match=message):
        PreparedTransfer(*args, **kwargs)


def test_from_frames_equals_preparing_the_decoded_fragments() -> None:
    version, payload = encode_transfer_fragments(FRAGMENTS)
    direct = PreparedTransfer(FRAGMENTS, BASES, BASES, src_limits=LIMITS, dst_limits=LIMITS)
    framed = PreparedTransfer.from_frames(
        version, payload, BASES, BASES, src_limits=LIMITS, dst_limits=LIMITS
    )
    assert framed.fragments == FRAGMENTS and len(framed) == len(FRAGMENTS)
    pages = np.array([5, 1, 2, 9])
    assert rows(framed.descriptors(pages, pages)) == rows(direct.descriptors(pages, pages))


def test_byte_equal_frames_reuse_the_parsed_fragments_and_others_never_do() -> None:
    version, payload = encode_transfer_fragments(FRAGMENTS)
    first = PreparedTransfer.from_frames(bytes(version), bytes(payload), BASES, BASES)
    hits = _core.frame_cache_info()[0]
    # Fresh bytes objects with the same content, as a socket delivers them.
    again = PreparedTransfer.from_frames(
        bytes(bytearray(version)), bytes(bytearray(payload)), BASES, BASES
    )
    assert again.shares_fragments_with(first)
    assert _core.frame_cache_info()[0] == hits + 1
    # One byte different (same length): a new parse, never the cached answer.
    changed = payload.replace(b'"dst_rank":1', b'"dst_rank":3', 1)
    assert len(changed) == len(payload) and changed != payload
    other = PreparedTransfer.from_frames(version, changed, BASES, BASES)
    assert not other.shares_fragments_with(first)
    assert other.fragments[0].dst_rank == 3 and first.fragments[0].dst_rank == 1
    entries, held = _core.frame_cache_info()[2:]
    assert (
        0 < entries <= pdplan.limits.FRAME_CACHE_ENTRIES and held <= pdplan.limits.FRAME_CACHE_BYTES
    )


def test_a_known_frame_with_other_buffers_points_at_those_buffers() -> None:
    """The frame cache keeps a frame's last placement; frames seen before but given other base
    pointers or limits must be placed against those, never answered from the memo."""
    version, payload = encode_transfer_fragments(FRAGMENTS)
    moved = BASES + np.uint64(1 << 20)
    pages = np.array([2, 0, 7])
    for bases in (BASES, moved, BASES, moved):
        prepared = PreparedTransfer.from_frames(
            version, bytes(bytearray(payload)), bases, bases, src_limits=LIMITS
        )
        got = prepared.descriptors(pages, pages, coalesce=False)
        assert rows(got) == python_loop(FRAGMENTS, bases.tolist(), bases.tolist(), pages, pages)
    # Same bases, limits too small for page 7: refused, though the loose limits were placed.
    tight = np.full(64, 4 * FRAGMENTS[0].src_page_stride_bytes, dtype=np.uint64)
    with pytest.raises(UnsupportedPDLayoutError):
        prepared = PreparedTransfer.from_frames(
            version, bytes(bytearray(payload)), moved, moved, src_limits=tight
        )
        prepared.descriptors(pages, pages)


def test_frame_limits_hold_for_prepared_transfers_too() -> None:
    version, payload = encode_transfer_fragments(FRAGMENTS)
    PreparedTransfer.from_frames(version, payload, BASES, BASES)  # now cached
    with pytest.raises(UnsupportedPDLayoutError, match="more than 3 fragments"):
        PreparedTransfer.from_frames(version, payload, BASES, BASES, max_fragments=3)
    with pytest.raises(UnsupportedPDLayoutError, match="over the limit"):
        PreparedTransfer.from_frames(version, payload, BASES, BASES, max_payload_bytes=100)
    with pytest.raises(UnsupportedPDLayoutError, match="invalid transfer plan payload"):
        PreparedTransfer.from_frames(b"1", b"[1]", BASES, BASES)
    assert DEFAULT_MAX_FRAGMENTS == 65536


def test_row_fragments_and_identity_plans_prepare_too() -> None:
    for planner in (llama("NHD"), llama(prefill_tp=2, decode_tp=2)):
        for source, fragments in planner.transfer_fragments(1).items():
            version, payload = encode_transfer_fragments(fragments)
            prepared = PreparedTransfer.from_frames(version, payload, BASES, BASES)
            pages = np.array([3, 4, 5])
            got = prepared.descriptors(pages, pages, coalesce=False)
            assert rows(got) == python_loop(fragments, BASES, BASES, pages, pages), source


def test_known_lists_encode_to_the_same_frames_without_reserialising() -> None:
    fragments = PLAN.transfer_fragments(0)[1]
    first = encode_transfer_fragments(fragments)
    entries = _core.encode_cache_info()[0]
    again = encode_transfer_fragments(fragments)
    assert again[0] is first[0] and again[1] is first[1]
    as_list = encode_transfer_fragments(list(fragments))
    assert as_list[1] is first[1]  # same objects in the same order: the same frames
    assert _core.encode_cache_info()[0] == entries
    # A different list (one fragment replaced by an equal copy, or reordered) is never
    # answered from another list's entry: equal content encodes equal, but anew.
    copy = [
        TransferFragment(*[getattr(f, n) for n in _core.TRANSFER_FRAGMENT_FIELDS])
        for f in fragments
    ]
    fresh = encode_transfer_fragments(copy)
    assert fresh == first and fresh[1] is not first[1]
    swapped = [fragments[1], fragments[0], *fragments[2:]]
    assert encode_transfer_fragments(swapped)[1] != first[1]
    # Objects that are not frozen fragments are never cached.
    duck = [
        SimpleNamespace(**{n: getattr(f, n) for n in _core.TRANSFER_FRAGMENT_FIELDS})
        for f in fragments
    ]
    before = _core.encode_cache_info()
    assert encode_transfer_fragments(duck) == first
    assert _core.encode_cache_info() == before


def test_nixl_indices_address_the_same_descriptors() -> None:
    fragments = llama("NHD").transfer_fragments(0)[1]
    prepared = PreparedTransfer(fragments, BASES, BASES)
    src_cap, dst_cap = 12, 20
    local, remote = prepared.nixl_prepped_lists(src_cap, dst_cap)
    assert local.shape == remote.shape == (sum(f.rows_per_page for f in fragments), 5)
    src_pages, dst_pages = np.array([11, 0, 4]), np.array([19, 3, 0])
    for buffers in (None, range(2, 6)):
        li, ri = prepared.nixl_prepped_indices(
            src_pages, dst_pages, src_cap, dst_cap, buffers=buffers
        )
        assert li.dtype == ri.dtype == np.int32

        def expand(lists: Any, index: Any) -> Any:
            row, page = np.divmod(index.astype(np.uint64), lists[0, 4])
            return lists[row, 0] + page * lists[row, 3], lists[row, 1]

        d = prepared.descriptors(src_pages, dst_pages, buffers=buffers, coalesce=False)
        src, length = expand(local, li)
        dst, _ = expand(remote, ri)
        assert np.array_equal(src, d.src_addrs) and np.array_equal(dst, d.dst_addrs)
        assert np.array_equal(length, d.lengths)
    with pytest.raises(UnsupportedPDLayoutError, match="past the 12 pages"):
        prepared.nixl_prepped_indices([12], [0], src_cap, dst_cap)
    with pytest.raises(UnsupportedPDLayoutError, match="32-bit"):
        prepared.nixl_prepped_lists(2**31, 1)
    with pytest.raises(UnsupportedPDLayoutError, match="at least one page"):
        prepared.nixl_prepped_lists(0, 5)


def test_one_prepared_transfer_serves_threads_at_once() -> None:
    prepared = PreparedTransfer(FRAGMENTS, BASES, BASES)
    pages = np.arange(2048)  # large enough to build without the GIL
    expected = rows(prepared.descriptors(pages, pages))
    results: list[Any] = []

    def work() -> None:
        results.append(rows(prepared.descriptors(pages, pages)))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 4

"""Strided descriptors (NIXL 1.5's N x 5 lists) against the flat descriptors of the same
request, on random models (full attention, windows, chunks, MLA, Mamba state), TP pairs, page
sizes that differ, head-major and token-major pages, CP, failover planners, page tables with
runs of every step and none, and slices.

The oracle is the flat path (itself held to labelled bytes in test_end_to_end.py and
test_tokens.py): a strided list expands to exactly its bytes, each destination byte from the
same source byte, no byte written twice; every entry's blocks lie inside one buffer and never
overlap; and an entry is never more than the flat descriptors it stands for."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from runtime_pairs import child_verdicts
from strided_moves import CALIBRATION_CASES, CASES, ENGINE_CASES
from test_slices import LAYER_KINDS, SPAN, Case, byte_map, prepared_pairs

from pdplan import (
    BufferKind,
    Mamba2Layer,
    ModelShape,
    Pairing,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    StridedDescriptors,
    TransferDescriptors,
    TransferFragment,
    UnsupportedPDLayoutError,
    model_buffer_layouts,
    token_slots,
)


def page_table(data: st.DataObject, count: int, name: str) -> np.ndarray:
    """``count`` distinct pages below ``5 * count``: runs of step 1 to 3 with gaps between,
    some runs reversed, the runs in order or shuffled."""
    pages: list[list[int]] = []
    cursor = data.draw(st.integers(0, 3), label=f"{name} start")
    left = count
    while left:
        step = data.draw(st.integers(1, 3), label=f"{name} step")
        length = min(left, data.draw(st.integers(1, count), label=f"{name} run"))
        run = [cursor + step * k for k in range(length)]
        pages.append(run[::-1] if data.draw(st.booleans()) else run)
        cursor = max(run) + data.draw(st.integers(1, 2), label=f"{name} gap")
        left -= length
    if data.draw(st.booleans(), label=f"{name} shuffled"):
        pages = data.draw(st.permutations(pages))
    out = np.array([p for run in pages for p in run], dtype=np.int64)
    assert len(set(out.tolist())) == count and out.max() < 5 * count
    return out


def check_shape(strided: StridedDescriptors, limits: tuple[list[int], list[int]]) -> None:
    """Both lists pair row for row; each row's blocks stay inside one buffer, apart."""
    assert strided.src.dtype == np.uint64 and strided.src.shape == strided.dst.shape
    assert strided.src.ndim == 2 and strided.src.shape[1] == 5
    assert (strided.src[:, [1, 4]] == strided.dst[:, [1, 4]]).all()
    for side, limit in ((strided.src, limits[0]), (strided.dst, limits[1])):
        for address, length, _, stride, count in side.tolist():
            assert count >= 1
            if count > 1:
                assert stride >= length, "blocks of one row overlap"
            last_end = address + (count - 1) * stride + length
            buffer = address // SPAN
            assert last_end <= buffer * SPAN + limit[buffer - 1], "a row leaves its buffer"


def equal_bytes(strided: StridedDescriptors, flat: Any) -> None:
    expanded = strided.expand()
    assert byte_map(expanded) == byte_map(flat)
    assert strided.num_descriptors == expanded.num_descriptors
    assert strided.total_bytes == flat.total_bytes
    assert strided.num_entries <= max(flat.num_descriptors, 0) or flat.num_descriptors == 0


def limits_of(planner: PDTransferPlanner, pages: int) -> tuple[list[int], list[int]]:
    return (
        [b.item_stride_bytes * pages for b in planner.prefill_buffers],
        [b.item_stride_bytes * pages for b in planner.decode_buffers],
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from([*sorted(LAYER_KINDS), "mamba"]), min_size=1, max_size=3),
    st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2), (4, 1)]),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from(["HND", "NHD"]),
    st.integers(1, 40),
    st.data(),
)
def test_strided_pages_expand_to_the_flat_descriptors(
    kinds: list[str], tps: tuple[int, int], size: int, kv_layout: str, length: int,
    data: st.DataObject,
) -> None:  # fmt: skip
    layers = tuple(
        Mamba2Layer(4, 4, 4, groups=4) if k == "mamba" else LAYER_KINDS[k] for k in kinds
    )
    shape = ModelShape(layer_kinds=layers, dtype="bfloat16", page_size=size)
    prefill, _ = model_buffer_layouts(shape, tps[0], tps[0], kv_layout)  # type: ignore[arg-type]
    _, decode = model_buffer_layouts(shape, tps[1], tps[1], kv_layout)  # type: ignore[arg-type]
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", tps[0]),
        decode_layout=ParallelLayout("decode", tps[1]),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )
    if tps[0] > 1 and data.draw(st.booleans(), label="a prefill rank gone"):
        try:
            planner = planner.without_prefill_ranks([tps[0] - 1])
        except UnsupportedPDLayoutError:
            pass  # only that rank held some bytes: the planner keeps them all
    count = -(-length // size)
    src_table = page_table(data, count, "src")
    # Runs compress where they are runs on both sides: tables drawn apart, or one the other's.
    pairing = data.draw(st.sampled_from(["apart", "same", "shifted"]), label="dst table")
    dst_table = {"apart": lambda: page_table(data, count, "dst"), "same": lambda: src_table,
                 "shifted": lambda: src_table + 3}[pairing]()  # fmt: skip
    tables = (src_table, dst_table)
    capacity = 5 * count + 3
    limits = limits_of(planner, capacity)
    for _, _, prepared in prepared_pairs(planner, capacity):
        whole = prepared.strided_descriptors(*tables)
        check_shape(whole, limits)
        equal_bytes(whole, prepared.descriptors(*tables, coalesce=False))
        assert whole.num_entries <= prepared.descriptors(*tables).num_descriptors
        # A slice: a layer group and the tokens final by then.
        group = sorted(data.draw(st.sets(st.integers(0, len(kinds) - 1), min_size=1)))
        stop = data.draw(st.integers(0, length))
        slice_ = dict(layers=group, tokens=range(0, stop), final_length=length)
        part = prepared.strided_descriptors(*tables, **slice_)
        check_shape(part, limits)
        equal_bytes(part, prepared.descriptors(*tables, **slice_))
        assert part.num_entries <= prepared.descriptors(*tables, **slice_).num_descriptors
        # The same request's pages read once (PreparedRequest): the same lists, row for row.
        request = prepared.request(*tables)
        assert len(request) == count
        for got, want in (
            (request.strided_descriptors(), whole),
            (request.strided_descriptors(**slice_), part),
            (request.strided_descriptors(layers=range(len(kinds) - 1, -1, -1)), whole),
            (request.descriptors(**slice_), prepared.descriptors(*tables, **slice_)),
        ):
            assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
        # A layer group alone reuses the request's page runs: its bytes against the flat path.
        group_rows = request.strided_descriptors(layers=group)
        check_shape(group_rows, limits)
        equal_bytes(group_rows, prepared.descriptors(*tables, layers=group, coalesce=False))


def test_a_request_s_pages_read_once_serve_a_prefill_still_running() -> None:
    # Prefill has written 3 pages of a request the decode side holds 6 for: slices of the
    # first 3 pages' tokens pair them; the whole request needs tables of one length.
    _, prepared = seventy_b()
    src, dst = np.arange(3), np.arange(10, 16)
    request = prepared[0].request(src, dst)
    assert len(request) == 3
    for tokens in (range(0, 48), range(16, 40)):
        got = request.strided_descriptors(layers=[0, 1], tokens=tokens)
        want = prepared[0].strided_descriptors(src, dst, layers=[0, 1], tokens=tokens)
        assert got.num_entries and all(np.array_equal(a, b) for a, b in zip(got, want))
        equal_bytes(got, prepared[0].descriptors(src, dst, layers=[0, 1], tokens=tokens))
    with pytest.raises(UnsupportedPDLayoutError, match="same length"):
        request.strided_descriptors()
    with pytest.raises(UnsupportedPDLayoutError, match="dst_pages"):
        prepared[0].request(src, [-1])
    # Page ids that wrap past 2^64 - 1 are no run: refused at the largest page, not wrapped.
    wrapping = np.array([2**64 - 1, 0], dtype=np.uint64)
    for table in (wrapping, [2**64 - 1, 0]):
        with pytest.raises(UnsupportedPDLayoutError, match="page 18446744073709551615"):
            prepared[0].strided_descriptors(table, [0, 1])
        with pytest.raises(UnsupportedPDLayoutError, match="page 18446744073709551615"):
            prepared[0].request(table, [0, 1]).strided_descriptors()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(sorted(LAYER_KINDS)), min_size=1, max_size=3),
    st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]),
    st.sampled_from([(4, 4), (4, 8), (8, 4), (3, 5)]),
    st.sampled_from([1, 2]),
    st.integers(1, 40),
    st.data(),
)
def test_strided_slot_maps_expand_to_the_flat_descriptors(
    kinds: list[str], tps: tuple[int, int], sizes: tuple[int, int], cp: int, length: int,
    data: st.DataObject,
) -> None:  # fmt: skip
    try:
        planner = Case(tuple(kinds), tps, sizes, cp).planner()
    except UnsupportedPDLayoutError:
        return  # a pair the planner refuses (CP with a window it cannot deal)
    pages = [-(-length // s) + 1 for s in sizes]
    tables = [page_table(data, n, f"side {i}") for i, n in enumerate(pages)]
    capacity = 5 * max(pages)
    limits = limits_of(planner, capacity)
    prefix = data.draw(st.integers(0, length))
    for decode_rank, prefill_rank, prepared in prepared_pairs(planner, capacity):
        layouts = (planner.prefill_layout, planner.decode_layout)
        src = token_slots(tables[0], sizes[0], length, layout=layouts[0], rank=prefill_rank)
        dst = token_slots(tables[1], sizes[1], length, layout=layouts[1], rank=decode_rank)
        whole = prepared.token_strided_descriptors(src, dst)
        check_shape(whole, limits)
        equal_bytes(whole, prepared.token_descriptors(src, dst, coalesce=False))
        assert whole.num_entries <= prepared.token_descriptors(src, dst).num_descriptors
        slice_ = dict(tokens=range(prefix // 2, length), final_length=length,
                      decode_prefix=prefix)  # fmt: skip
        part = prepared.token_strided_descriptors(src, dst, **slice_)
        check_shape(part, limits)
        equal_bytes(part, prepared.token_descriptors(src, dst, **slice_))


@st.composite
def state_fragments(draw: st.DrawFn) -> list[TransferFragment]:
    """Fragments as a Mamba or GDN table makes them: several parts of one slot (conv, SSM,
    their TP shards) a buffer, touching or apart, some of a few rows, each of every page or of
    the first ``page_count``; buffers in order, a part's bytes inside its page on both sides."""
    out = []
    for buffer in range(draw(st.integers(1, 3))):
        stride = draw(st.sampled_from([64, 96, 128]))
        kind = draw(st.sampled_from([BufferKind.MAMBA_STATE, BufferKind.TARGET_K]))
        page_count = draw(st.sampled_from([None, 1, 2]))
        offsets = [0, 0]
        for _ in range(draw(st.integers(1, 4))):
            rows = draw(st.sampled_from([1, 1, 2, 4]))
            run = draw(st.sampled_from([4, 8, 16]))
            row_strides = [draw(st.sampled_from([run, run, 2 * run])) for _ in range(2)]
            ends = [o + draw(st.sampled_from([0, 0, 4])) for o in offsets]
            if any(e + (rows - 1) * rs + run > stride for e, rs in zip(ends, row_strides)):
                break
            out.append(TransferFragment(
                buffer, kind, 0, 0, stride, stride, ends[0], ends[1], run * rows, page_count,
                rows_per_page=rows,
                src_row_stride_bytes=row_strides[0] if rows > 1 else 0,
                dst_row_stride_bytes=row_strides[1] if rows > 1 else 0,
            ))  # fmt: skip
            offsets = [e + (rows - 1) * rs + run for e, rs in zip(ends, row_strides)]
    return out


@settings(max_examples=400, deadline=None)
@given(state_fragments(), st.data())
def test_strided_lists_are_never_longer_than_the_flat_descriptors(
    fragments: list[TransferFragment], data: st.DataObject
) -> None:
    # The oracle: the flat descriptors, coalesced, of the same request (12 rows stood for 6
    # when a slot's parts touched, one row a part); the bytes as the flat path moves them.
    assume(fragments)
    count = data.draw(st.integers(1, 8), label="pages")
    tables = (page_table(data, count, "src"), page_table(data, count, "dst"))
    bases = [SPAN * (i + 1) for i in range(3)]
    prepared = PreparedTransfer(fragments, bases, bases, src_limits=[SPAN] * 3,
                                dst_limits=[SPAN] * 3)  # fmt: skip
    strided = prepared.strided_descriptors(*tables)
    flat = prepared.descriptors(*tables)
    assert strided.num_entries <= flat.num_descriptors
    equal_bytes(strided, prepared.descriptors(*tables, coalesce=False))
    check_shape(strided, ([SPAN] * 3, [SPAN] * 3))


def seventy_b(decode_rank: int = 0) -> tuple[Pairing, list[PreparedTransfer]]:
    pairing = Pairing("llama-3-70b", ParallelLayout("prefill", 8), ParallelLayout("decode", 2))
    planner = pairing.planner
    bases = [SPAN * (i + 1) for i in range(len(planner.prefill_buffers))]
    out = []
    for source in planner.transfer_fragments(decode_rank):
        out.append(PreparedTransfer.from_layouts(planner, decode_rank, source, bases, bases,
                                                 src_limits=[SPAN] * len(bases),
                                                 dst_limits=[SPAN] * len(bases)))  # fmt: skip
    return pairing, out


def test_contiguous_runs_are_one_row_a_fragment_row() -> None:
    # Llama-3-70B, TP 8 -> 2: each prefill rank's one KV head is a slice of the decode rank's
    # four in every HND page (80 layers, K and V: 160 fragments of one row). Pages consecutive
    # on both sides make one row a fragment; a page table of step 3 and 2 too; backwards, none
    # compress (a stride is unsigned) and every descriptor is its own row.
    _, prepared = seventy_b()
    pages = np.arange(2048)
    for src, dst in ((pages, pages + 1), (3 * pages, 2 * pages + 7)):
        strided = prepared[0].strided_descriptors(src, dst)
        assert strided.num_entries == 160
        assert strided.num_descriptors == 160 * 2048
        group = prepared[0].strided_descriptors(src, dst, layers=range(8))
        assert group.num_entries == 16
        # A range of layers is read as its list would be, any step.
        listed = prepared[0].strided_descriptors(src, dst, layers=[7, 5, 3, 1])
        stepped = prepared[0].strided_descriptors(src, dst, layers=range(7, 0, -2))
        assert (listed.src == stepped.src).all() and listed.num_entries == 8
    backwards = prepared[0].strided_descriptors(pages[::-1], pages[::-1], layers=[0])
    assert backwards.num_entries == 2 * 2048
    # Two runs: a break in the page table splits each fragment's row in two.
    broken = np.concatenate([pages[:1000], pages[1000:] + 5000])
    assert prepared[0].strided_descriptors(broken, broken, layers=[0]).num_entries == 4


def test_token_major_rows_continue_across_pages() -> None:
    # NHD pages: a head slice is a row per token; with pages consecutive on both sides the
    # rows of one page continue into the next page's (page stride == rows x row stride), so a
    # fragment is one row for the whole run, whatever the page count.
    shape = ModelShape(layer_kinds=(LAYER_KINDS["full"],) * 2, dtype="bfloat16", page_size=4)
    prefill, _ = model_buffer_layouts(shape, 2, 2, "NHD")
    _, decode = model_buffer_layouts(shape, 1, 1, "NHD")
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )
    limits = limits_of(planner, 64)
    ((_, _, prepared), *_) = prepared_pairs(planner, 64)
    pages = np.arange(10)
    strided = prepared.strided_descriptors(pages, pages + 3)
    flat = prepared.descriptors(pages, pages + 3, coalesce=False)
    check_shape(strided, limits)
    assert flat.num_descriptors == 4 * 10 * 4  # 4 fragments x 10 pages x 4 token rows
    assert strided.num_entries == 4
    # Scattered pages: a row a page (its token rows), not a row a token.
    scattered = np.array([9, 2, 5, 0])
    assert prepared.strided_descriptors(scattered, scattered).num_entries == 4 * 4
    # Pages a step of 2 and 3 apart: a page's rows no longer continue into the next page's,
    # so each token row is one row across the run (the two sides' row strides differ: a
    # prefill rank's one head against the decode rank's two).
    for src, dst in ((np.arange(0, 16, 2), np.arange(0, 24, 3)), (np.arange(8), 2 * np.arange(8))):
        strided = prepared.strided_descriptors(src, dst)
        check_shape(strided, limits)
        assert strided.num_entries == 4 * 4  # 4 fragments x 4 token rows
        assert byte_map(strided.expand()) == byte_map(prepared.descriptors(src, dst))


def test_strided_lists_refuse_what_descriptors_refuse() -> None:
    _, prepared = seventy_b()
    with pytest.raises(UnsupportedPDLayoutError, match="page"):
        prepared[0].strided_descriptors([0, 1], [0])
    with pytest.raises(UnsupportedPDLayoutError, match="limit"):
        prepared[0].strided_descriptors([1 << 40], [0])
    with pytest.raises(UnsupportedPDLayoutError, match="negative"):
        prepared[0].strided_descriptors([0], [0], layers=range(-1, 2))
    devices = prepared[0].strided_descriptors([0], [0]).on_devices(3, 5)
    assert set(devices.src[:, 2].tolist()) == {3} and set(devices.dst[:, 2].tolist()) == {5}


@pytest.mark.nixl
def test_strided_lists_move_byte_exact_through_nixl(nixl_engine: None) -> None:
    """Each side's strided list prepared by NIXL 1.5 itself (``prep_xfer_dlist`` of an N x 5
    array) and written block by block: the same bytes as the flat descriptors by memmove."""
    code, passed, output = child_verdicts("strided_moves.py", "nixl")
    everything = [*CASES, *ENGINE_CASES, *CALIBRATION_CASES]
    assert code == 0 and sorted(passed) == sorted(everything), output


class RecordingEngine:
    """The connector engine's two reads, recorded (local, remote, lengths as flat columns)."""

    takes_strided = True

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def read(self, peer: bytes, local: Any, remote: Any, lengths: Any) -> str:
        self.calls.append(("flat", TransferDescriptors(remote, local, lengths)))
        return "handle"

    def read_strided(self, peer: bytes, local: Any, remote: Any) -> str:
        self.calls.append(("strided", StridedDescriptors(remote, local)))
        return "handle"


@pytest.mark.parametrize(
    ("strided", "pages", "form"),
    [(True, np.arange(6), "strided"), (True, np.arange(5, -1, -1), "flat"),
     (False, np.arange(6), "flat")],
)  # fmt: skip
def test_a_decode_rank_reads_rows_where_they_compress_and_flat_elsewhere(
    strided: bool, pages: np.ndarray, form: str
) -> None:
    from pdplan.session._reads import Reads

    shape = ModelShape(layer_kinds=(LAYER_KINDS["full"],) * 2, dtype="bfloat16", page_size=4)
    prefill, _ = model_buffer_layouts(shape, 2, 2)
    _, decode = model_buffer_layouts(shape, 1, 1)
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2), decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=prefill, decode_buffers=decode,
    )  # fmt: skip
    ((_, _, prepared), *_) = prepared_pairs(planner, 16)
    reads, engine = Reads(strided), RecordingEngine()
    assert not reads and reads.start(engine, b"peer") is None
    reads.add(prepared, pages, pages + 1, buffers=[0])
    more = Reads(strided)
    more.add(prepared, pages, pages + 1, buffers=[1, 2, 3], layers=[1])
    reads.extend(more)
    assert reads.start(engine, b"peer") == "handle"
    ((used, got),) = engine.calls
    assert used == form
    flat = got.expand() if used == "strided" else got
    # Buffer 0 (layer 0's K), then of buffers 1-3 those of layer 1 (its K and V).
    assert byte_map(flat) == byte_map(prepared.descriptors(pages, pages + 1, buffers=[0, 2, 3]))

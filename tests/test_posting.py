"""The cost model's choice of descriptor form (flat, NIXL 1.5's strided lists, staging) and the
calibration that measures an engine's posting costs. Oracles: the roofline worked out by hand
here, and an engine whose every move advances a clock by costs set here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pdplan import (
    CostModel,
    FormEstimate,
    ModelShape,
    ParallelLayout,
    PDTransferPlanner,
    PreparedTransfer,
    StridedDescriptors,
    TransferDescriptors,
    UnsupportedPDLayoutError,
    calibrate_posting,
    model_buffer_layouts,
)
from pdplan._layouts import AttentionLayer
from pdplan._staging import FORMS

sys.path.insert(0, str(Path(__file__).resolve().parent))


def by_hand(model: CostModel, counts: tuple[int, ...], rows: int, blocks: int) -> dict[str, float]:
    """Each form's roofline, from the figures' definitions."""
    direct, wire, gather, scatter, nbytes = counts
    bytes_s = nbytes / model.network_bytes_per_s

    def copy(segments: int) -> float:
        if not segments:
            return 0.0
        return model.per_copy_s + segments * model.per_segment_s + nbytes / model.copy_bytes_per_s

    return {
        "flat": max(direct * model.per_descriptor_s, bytes_s),
        "strided": max(rows * model.per_row_s + blocks * model.per_block_s, bytes_s),
        "staging": copy(gather) + max(wire * model.per_descriptor_s, bytes_s) + copy(scatter),
    }


def chosen_by_hand(
    model: CostModel, counts: tuple[int, ...], rows: int, blocks: int, offered: tuple[str, ...]
) -> str:
    """The least time; of forms that tie (within rounding), the least posting (staging's is
    its time), then the earlier of flat, strided, staging."""
    times = {f: t for f, t in by_hand(model, counts, rows, blocks).items() if f in offered}
    posting = {
        "flat": counts[0] * model.per_descriptor_s,
        "strided": rows * model.per_row_s + blocks * model.per_block_s,
        "staging": times.get("staging", 0.0),
    }
    least = min(times.values())
    tied = [f for f in times if times[f] <= least * (1 + 1e-9)]
    fewest = min(posting[f] for f in tied)
    return next(f for f in tied if posting[f] <= fewest * (1 + 1e-9))


@pytest.mark.parametrize(
    ("counts", "rows"),
    [
        ((100_000, 1, 100_000, 100_000, 1 << 20), 10),  # many small blocks in few rows
        ((100_000, 1, 100_000, 100_000, 1 << 20), 100_000),  # a row a block
        ((64, 1, 64, 64, 1 << 30), 64),  # a GiB in big blocks: bytes-bound, a row a block
        ((64, 1, 64, 64, 1 << 30), 2),  # bytes-bound, rows that post less: strided
        ((4_000, 1, 10, 10, 1 << 24), 4_000),  # staging's few copies
    ],
)
def test_the_form_chosen_takes_least_time_by_the_roofline(
    counts: tuple[int, int, int, int, int], rows: int
) -> None:
    for model in (CostModel(), CostModel(per_row_s=1e-6, per_block_s=0.0, per_copy_s=1e-3)):
        want = by_hand(model, counts, rows, counts[0])
        got = model.choose_form_counts(counts, strided=(rows, counts[0]))
        assert (got.flat_s, got.strided_s, got.staging_s) == pytest.approx(
            (want["flat"], want["strided"], want["staging"]), rel=1e-12
        )
        assert got.form == chosen_by_hand(model, counts, rows, counts[0], FORMS)
        assert got.seconds == pytest.approx(min(want.values()), rel=1e-12)
        only_flat = model.choose_form_counts(counts, staging=False)
        assert (only_flat.form, only_flat.strided_s, only_flat.staging_s) == ("flat", None, None)


def test_default_rows_win_once_they_stand_for_more_than_one_block() -> None:
    model = CostModel()
    counts = (1000, 0, 0, 0, 64_000)
    one_each = model.choose_form_counts(counts, strided=(1000, 1000), staging=False)
    two_each = model.choose_form_counts(counts, strided=(500, 1000), staging=False)
    # A row of one block costs what a descriptor does: the default form stays.
    assert one_each.strided_s == pytest.approx(one_each.flat_s, rel=1e-12)
    assert (one_each.form, two_each.form) == ("flat", "strided")


def prepared_pair(kv_layout: str) -> PreparedTransfer:
    shape = ModelShape(layer_kinds=(AttentionLayer(4, 64),) * 4, dtype="bfloat16", page_size=16)
    prefill, decode = model_buffer_layouts(shape, 2, 1, kv_layout)  # type: ignore[arg-type]
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=prefill,
        decode_buffers=decode,
    )
    bases = [(i + 1) << 36 for i in range(len(prefill))]
    limits = [b.item_stride_bytes * 512 for b in prefill]
    dst_limits = [b.item_stride_bytes * 512 for b in decode]
    return PreparedTransfer.from_layouts(
        planner, 0, 0, bases, bases, src_limits=limits, dst_limits=dst_limits
    )


@pytest.mark.parametrize("kv_layout", ["HND", "NHD"])
def test_choose_form_weighs_the_request_s_own_lists(kv_layout: str) -> None:
    prepared = prepared_pair(kv_layout)
    model = CostModel(per_copy_s=1.0)  # staging never pays here: flat against strided
    for src, dst in [(np.arange(200), np.arange(200) + 7), (np.arange(398, -1, -2),) * 2]:
        got = model.choose_form(prepared, src, dst)
        strided = prepared.strided_descriptors(src, dst)
        counts = prepared.staging_counts(src, dst)
        want = by_hand(model, tuple(counts), strided.num_entries, strided.num_descriptors)
        assert (got.flat_s, got.strided_s) == pytest.approx((want["flat"], want["strided"]))
        assert got.strided_rows == strided.num_entries
        assert got.descriptors == counts.direct_descriptors
        assert got.form == chosen_by_hand(
            model, tuple(counts), strided.num_entries, strided.num_descriptors, FORMS
        )
        mooncake = model.choose_form(prepared, src, dst, forms=("flat", "staging"))
        assert mooncake.strided_s is None and mooncake.form != "strided"
    with pytest.raises(UnsupportedPDLayoutError, match="forms must be"):
        model.choose_form(prepared, [0], [0], forms=("flat", "rdma"))
    with pytest.raises(UnsupportedPDLayoutError, match="per_row_s"):
        CostModel(per_row_s=-1.0)
    for bad_counts in [(1, 2), (1, 2, 3, 4, -5), (1, 2, 3, 4, True)]:
        with pytest.raises(UnsupportedPDLayoutError, match="five staging counts"):
            model.choose_form_counts(bad_counts)  # type: ignore[arg-type]
    for strided in [(-1, 5), [3, 10], (1, 2, 3), (1.5, 2)]:
        with pytest.raises(UnsupportedPDLayoutError, match="strided must be"):
            model.choose_form_counts((1, 0, 0, 0, 1), strided=strided)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedPDLayoutError, match="staging must be"):
        model.choose_form_counts((1, 0, 0, 0, 1), staging=1)  # type: ignore[arg-type]


class ClockedEngine:
    """Moves nothing; each move advances a clock by a fixed start plus per-item costs set
    here, and records every block it was asked to touch."""

    def __init__(self, per_descriptor: float, per_row: float, per_block: float) -> None:
        self.now = 0.0
        self.costs = (per_descriptor, per_row, per_block)
        self.touched: list[tuple[int, int, int]] = []  # (src, dst, length)

    def clock(self) -> float:
        return self.now

    def flat(self, d: TransferDescriptors) -> None:
        self.now += 5e-5 + d.num_descriptors * self.costs[0]
        self.touched += zip(d.src_addrs.tolist(), d.dst_addrs.tolist(), d.lengths.tolist())

    def strided(self, s: StridedDescriptors) -> None:
        self.now += 7e-5 + s.num_entries * self.costs[1] + s.num_descriptors * self.costs[2]
        f = s.expand()
        self.touched += zip(f.src_addrs.tolist(), f.dst_addrs.tolist(), f.lengths.tolist())


def test_calibration_finds_the_engine_s_costs_and_stays_in_its_memory() -> None:
    engine = ClockedEngine(2e-6, 3e-7, 5e-7)
    src, dst = (1 << 30, 1 << 20), (1 << 40, 1 << 20)
    done = calibrate_posting(
        engine.flat, engine.strided, src=src, dst=dst, counts=(16, 128, 1024), repeat=2,
        clock=engine.clock, model=CostModel(network_bytes_per_s=1e9),
    )  # fmt: skip
    m = done.model
    assert (m.per_descriptor_s, m.per_row_s, m.per_block_s) == pytest.approx(
        (2e-6, 3e-7, 5e-7), rel=1e-6
    )
    assert m.network_bytes_per_s == 1e9  # the figures it does not measure are kept
    for s, d, length in engine.touched:
        assert src[0] <= s and s + length <= src[0] + src[1]
        assert dst[0] <= d and d + length <= dst[0] + dst[1]
    # Without strided lists, only the flat figure is measured.
    flat_only = calibrate_posting(
        engine.flat, None, src=src, dst=dst, clock=engine.clock, repeat=1
    ).model
    assert flat_only.per_descriptor_s == pytest.approx(2e-6, rel=1e-6)
    assert (flat_only.per_row_s, flat_only.per_block_s) == (
        CostModel().per_row_s,
        CostModel().per_block_s,
    )


@pytest.mark.parametrize(
    ("kwargs", "refusal"),
    [
        (dict(src=(0, 100), dst=(0, 1 << 20)), "at least 262144 bytes"),
        (dict(src=(0, 1 << 20), dst=(-1, 1 << 20)), "dst="),
        (dict(src=(0, 1 << 20), dst=(0, 1 << 20), counts=(8, 8)), "two different counts"),
        (dict(src=(0, 1 << 20), dst=(0, 1 << 20), repeat=0), "repeat"),
        (dict(src=(None, 5), dst=(0, 1 << 20)), r"src must be \(address, bytes\)"),
        (dict(src=(0, 1 << 20), dst=(0, 1 << 20), counts=[[1], [2]]), "two different counts"),
        (dict(src=(0, 1 << 20), dst=(0, 1 << 20), model="fast"), "model must be a CostModel"),
    ],
)
def test_calibration_refuses_what_it_cannot_measure(kwargs: dict[str, Any], refusal: str) -> None:
    engine = ClockedEngine(1e-6, 1e-6, 1e-6)
    with pytest.raises(UnsupportedPDLayoutError, match=refusal):
        calibrate_posting(engine.flat, engine.strided, clock=engine.clock, **kwargs)
    assert not engine.touched
    memory = dict(src=(0, 1 << 20), dst=(0, 1 << 20))
    with pytest.raises(UnsupportedPDLayoutError, match="move_flat must be a callable"):
        calibrate_posting(None, engine.strided, **memory)  # type: ignore[arg-type]
    assert not engine.touched


def test_a_decode_rank_reads_the_form_its_model_chooses() -> None:
    from test_strided import RecordingEngine

    from pdplan.session._reads import Reads

    prepared = prepared_pair("HND")
    pages = np.arange(50)
    for model, form in [
        (CostModel(), "strided"),
        (CostModel(per_row_s=1e-3), "flat"),  # rows dearer than all their blocks flat
    ]:
        reads, engine = Reads(True, model), RecordingEngine()
        reads.add(prepared, pages, pages + 1)
        reads.start(engine, b"peer")
        ((used, got),) = engine.calls
        assert used == form
        flat = got.expand() if used == "strided" else got
        want = prepared.descriptors(pages, pages + 1)
        assert sorted(zip(*flat)) == sorted(zip(*want))
    assert isinstance(CostModel().choose_form_counts((1, 0, 0, 0, 1)), FormEstimate)

"""Large worlds: the whole-cluster routing table, refusing worlds past the limit at once, and
planning from two threads at once."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from pdplan import (
    BufferKind,
    BufferLayout,
    ParallelLayout,
    PDTransferPlanner,
    UnsupportedPDLayoutError,
)
from pdplan.limits import MAX_WORLD_SIZE

from layouts import plan_to_dict
from oracle import expected_routing


def kv_buffers(tp: int, layers: int = 4, heads: int = 8) -> tuple[BufferLayout, ...]:
    replica = tp // heads if tp > heads else 1
    unit = 16 * 128 * 2
    return tuple(
        BufferLayout(
            i,
            BufferKind.TARGET_K if i % 2 == 0 else BufferKind.TARGET_V,
            "kv_head",
            heads,
            16,
            unit,
            heads // (tp // replica) * unit,
            replica,
        )
        for i in range(2 * layers)
    )


def cluster(
    prefill_dp: int, prefill_tp: int, decode_dp: int, decode_tp: int, layers: int = 4
) -> PDTransferPlanner:
    return PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", prefill_dp * prefill_tp, prefill_dp),
        decode_layout=ParallelLayout("decode", decode_dp * decode_tp, decode_dp),
        prefill_buffers=kv_buffers(prefill_tp, layers),
        decode_buffers=kv_buffers(decode_tp, layers),
    )


@pytest.mark.parametrize(
    "shape", [(4, 16, 4, 4), (2, 2, 2, 8), (2, 4, 1, 4), (1, 4, 1, 1), (3, 8, 2, 2)]
)
def test_the_routing_table_is_what_the_dealing_says(shape: tuple[int, int, int, int]) -> None:
    planner = cluster(*shape)
    table = planner.routing_table()
    assert all(column.dtype == np.int64 for column in table)
    identity = planner.plan_for_decode_rank(0).plan_kind == "identity"
    layout = (
        planner.prefill_layout,
        planner.decode_layout,
        planner.prefill_buffers,
        planner.decode_buffers,
    )
    rows = [row for row in zip(*(column.tolist() for column in table)) if row[2]]
    assert rows == expected_routing(*layout, identity=identity)
    # Each prefill rank's row count is its fanout (no two decode groups share a source here).
    moving = table.prefill_rank[table.fragment_count > 0]
    counts = np.bincount(moving, minlength=planner.prefill_layout.world_size)
    assert counts.tolist() == list(planner.source_fanout.values())


def test_the_scale_target_world_routes_every_rank_and_verifies() -> None:
    planner = cluster(256, 16, 256, 4, layers=80)
    table = planner.routing_table()
    # 1024 decode ranks, each reading one replica-group leader per KV head pair: 2 sources,
    # and notifying the other 2 prefill ranks that hold its heads (16 prefill TP ranks for 8
    # KV heads hold each head twice, so a decode rank's 2 heads sit on 4 of them).
    moving = table.fragment_count > 0
    assert int(moving.sum()) == 2048
    assert set(table.fragment_count[moving].tolist()) == {160}
    assert int((~moving).sum()) == 2048
    fanout = planner.source_fanout
    assert len(fanout) == 4096
    assert sorted(set(fanout.values())) == [0, 1]
    planner.verify()


def test_a_world_past_the_limit_is_refused_at_once() -> None:
    with pytest.raises(UnsupportedPDLayoutError, match="MAX_WORLD_SIZE"):
        ParallelLayout("prefill", MAX_WORLD_SIZE + 1)
    with pytest.raises(UnsupportedPDLayoutError, match="MAX_WORLD_SIZE"):
        ParallelLayout("decode", 2**31)
    # The limit itself plans, without per-rank loops over buffers.
    planner = cluster(MAX_WORLD_SIZE // 8, 8, 1, 1, layers=1)
    assert len(planner.source_fanout) == MAX_WORLD_SIZE


def test_two_threads_planning_at_once_match_one_thread() -> None:
    planner = cluster(16, 16, 16, 4, layers=40)
    ranks = range(planner.decode_layout.world_size)
    expected = [plan_to_dict(planner.plan_for_decode_rank(r)) for r in ranks]
    expected_table = [c.tolist() for c in planner.routing_table()]
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            plans = [plan_to_dict(planner.plan_for_decode_rank(r)) for r in ranks]
            table = [c.tolist() for c in planner.routing_table()]
            built = cluster(16, 16, 16, 4, layers=40).source_fanout
            results[worker] = (plans, table, built)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for plans, table, fanout in results.values():
        assert plans == expected
        assert table == expected_table
        assert fanout == planner.source_fanout
    assert len(results) == 2


def test_verify_names_a_gap() -> None:
    unit = 64
    replicated = BufferLayout(0, BufferKind.TARGET_K, "replicated", 4, 16, unit, 4 * unit)
    too_small = BufferLayout(0, BufferKind.TARGET_K, "replicated", 4, 16, unit, 100)
    planner = PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", 2),
        decode_layout=ParallelLayout("decode", 1),
        prefill_buffers=(replicated,),
        decode_buffers=(too_small,),
    )
    with pytest.raises(
        UnsupportedPDLayoutError, match=r"decode rank 0, buffer 0 .*100\.\.256.*gap"
    ):
        planner.verify()

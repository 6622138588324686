"""pytest-benchmark: pdplan and the pure-Python way on the scale issue's world, grouped so each
group shows both side by side. Each benchmark also checks that the two agree.

    pytest benches --benchmark-enable --benchmark-group-by=group
"""

from __future__ import annotations

from dataclasses import astuple
from typing import Any

import pytest

import pdplan

import pure_python
from scenarios import large_world

WORLD = large_world()
RANKS = range(WORLD.decode.world_size)


@pytest.fixture(scope="module")
def planners() -> tuple[pdplan.PDTransferPlanner, pure_python.ArithmeticPlanner]:
    return WORLD.planner(), pure_python.ArithmeticPlanner(*WORLD.args)


@pytest.fixture(scope="module")
def fragment_lists(planners: Any) -> list[tuple[pdplan.TransferFragment, ...]]:
    ours, _ = planners
    return [
        fragments
        for rank in range(0, WORLD.decode.world_size, 8)
        for fragments in ours.plan_for_decode_rank(rank).fragments_by_prefill_rank.values()
    ]


@pytest.mark.benchmark(group="construct 4096->1024 ranks")
def test_construct_pdplan(benchmark: Any) -> None:
    planner = benchmark(WORLD.planner)
    assert len(planner.source_fanout) == 4096


@pytest.mark.benchmark(group="construct 4096->1024 ranks")
def test_construct_pure_python_arithmetic(benchmark: Any, planners: Any) -> None:
    planner = benchmark(pure_python.ArithmeticPlanner, *WORLD.args)
    assert planner.fanout == planners[0].source_fanout


@pytest.mark.benchmark(group="construct 4096->1024 ranks")
def test_construct_pure_python_walk(benchmark: Any, planners: Any) -> None:
    planner = benchmark.pedantic(pure_python.WalkingPlanner, args=WORLD.args, rounds=1)
    assert planner.fanout == planners[0].source_fanout


@pytest.mark.benchmark(group="plan every decode rank")
def test_plan_all_pdplan(benchmark: Any, planners: Any) -> None:
    ours, theirs = planners
    plans = benchmark(lambda: [ours.plan_for_decode_rank(r) for r in RANKS])
    for rank in (0, 511, 1023):
        expected = theirs.plan_for_decode_rank(rank)
        assert plans[rank].target_prefill_ranks == expected.target_prefill_ranks
        assert [
            [astuple(f)[:10] for f in fs] for fs in plans[rank].fragments_by_prefill_rank.values()
        ] == [[astuple(f)[:10] for f in fs] for fs in expected.fragments_by_prefill_rank.values()]


@pytest.mark.benchmark(group="plan every decode rank")
def test_plan_all_pure_python_arithmetic(benchmark: Any, planners: Any) -> None:
    _, theirs = planners
    plans = benchmark.pedantic(lambda: [theirs.plan_for_decode_rank(r) for r in RANKS], rounds=1)
    assert len(plans) == len(RANKS)


@pytest.mark.benchmark(group="encode fragment lists")
def test_encode_pdplan(benchmark: Any, fragment_lists: Any) -> None:
    frames = benchmark(lambda: [pdplan.encode_transfer_fragments(f) for f in fragment_lists])
    assert frames == [pure_python.encode(f) for f in fragment_lists]


@pytest.mark.benchmark(group="encode fragment lists")
def test_encode_pure_python(benchmark: Any, fragment_lists: Any) -> None:
    frames = benchmark(lambda: [pure_python.encode(f) for f in fragment_lists])
    assert len(frames) == len(fragment_lists)


@pytest.mark.benchmark(group="decode fragment lists")
def test_decode_pdplan(benchmark: Any, fragment_lists: Any) -> None:
    frames = [pdplan.encode_transfer_fragments(f) for f in fragment_lists]
    decoded = benchmark(lambda: [pdplan.decode_transfer_fragments(v, p) for v, p in frames])
    assert decoded == fragment_lists


@pytest.mark.benchmark(group="decode fragment lists")
def test_decode_pure_python(benchmark: Any, fragment_lists: Any) -> None:
    frames = [pdplan.encode_transfer_fragments(f) for f in fragment_lists]
    decoded = benchmark(lambda: [pure_python.decode(v, p, pdplan.BufferKind) for v, p in frames])
    assert [[astuple(f)[:10] for f in fs] for fs in decoded] == [
        [astuple(f)[:10] for f in fs] for fs in fragment_lists
    ]


@pytest.mark.benchmark(group="routing table")
def test_routing_table_pdplan(benchmark: Any, planners: Any) -> None:
    table = benchmark(planners[0].routing_table)
    # Two sources a decode rank, and two notify-only pairs (the sources' replicas).
    assert int((table.fragment_count > 0).sum()) == 2 * WORLD.decode.world_size
    assert len(table.decode_rank) == 4 * WORLD.decode.world_size

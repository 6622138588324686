"""End to end: plan on the decode side, ship fragments only through the wire format, build
descriptors on each prefill rank, write with a transfer engine, and compare every decode cache
byte for byte with the expected reshard (guard bytes included).

The in-memory double runs every case in one process; the `mooncake` tests run one process a
rank, each with its own Mooncake engine over TCP on loopback. In CI (CI=true) a missing engine
fails the run instead of skipping."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from pd_transfer import (
    Buffer,
    Outcome,
    Scenario,
    kv_cache,
    run_in_memory,
    run_in_processes,
)

from pdplan import BufferKind

UNIT = 16 * 8 * 2  # 16 tokens x head dim 8 x bf16
SHUFFLED = {"src_pages": (9, 2, 3, 4, 11, 0), "dst_pages": (5, 6, 7, 1, 10, 3)}

CASES = [
    Scenario("tp8_to_tp2", 8, 2, kv_cache(2, 8, UNIT), **SHUFFLED),
    Scenario("tp2_to_tp8", 2, 8, kv_cache(2, 8, UNIT), **SHUFFLED),
    Scenario("gqa_tp4_2heads_to_tp1", 4, 1, kv_cache(2, 2, UNIT, prefill_replica=2)),
    Scenario(
        "gqa_tp4_to_tp2_replicated_both_sides",
        4,
        2,
        kv_cache(1, 1, UNIT, prefill_replica=4, decode_replica=2),
    ),
    Scenario(
        "mamba_state_tp4_to_tp2",
        4,
        2,
        (
            *kv_cache(1, 4, UNIT),
            Buffer(2, BufferKind.MAMBA_STATE, "state_channel", 16, 64, padding=32),
        ),
        **SHUFFLED,
    ),
    Scenario(
        "mla_replicated_tp4_to_tp2",
        4,
        2,
        (
            Buffer(0, BufferKind.TARGET_K, "replicated", 1, 576 * 2 * 4),
            Buffer(1, BufferKind.DRAFT_K, "replicated", 1, 576 * 2 * 4),
        ),
        **SHUFFLED,
    ),
    Scenario(
        "two_dp_groups_each_side", 2, 1, kv_cache(2, 4, UNIT), prefill_dp=2, decode_dp=2, **SHUFFLED
    ),
    Scenario(
        "identity_tp2_whole_items",
        2,
        2,
        kv_cache(2, 4, UNIT),
        src_pages=(0, 1, 2, 8, 9),
        dst_pages=(3, 4, 5, 6, 11),
    ),
]


def check(scenario: Scenario, outcome: Outcome) -> None:
    assert outcome.mismatches == []
    assert outcome.descriptors > 0 and outcome.bytes > 0
    # Each prefill rank is written to by exactly as many decode ranks as its fanout says.
    assert outcome.writes_per_prefill_rank == scenario.planner().source_fanout


@pytest.mark.parametrize("scenario", CASES, ids=lambda s: s.name)
def test_in_memory(scenario: Scenario) -> None:
    check(scenario, run_in_memory(scenario))


def test_a_wrong_plan_is_caught_by_the_byte_comparison() -> None:
    """The comparison is not vacuous: corrupting one prefill cache shows up as a mismatch."""
    import pd_transfer

    original = pd_transfer.filled_prefill_cache

    def corrupted(*args: object, **kwargs: object) -> object:
        cache = original(*args, **kwargs)  # type: ignore[arg-type]
        cache[CASES[0].src_pages[0], 0] ^= 0xFF
        return cache

    pd_transfer.filled_prefill_cache = corrupted
    try:
        outcome = run_in_memory(CASES[0])
    finally:
        pd_transfer.filled_prefill_cache = original
    assert outcome.mismatches


@pytest.mark.mooncake
@pytest.mark.parametrize("scenario", CASES, ids=lambda s: s.name)
def test_through_mooncake(scenario: Scenario, mooncake_engine: None) -> None:
    check(scenario, run_in_processes(scenario))

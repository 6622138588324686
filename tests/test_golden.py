"""pdplan against the reference's own answers, recorded in tests/data/golden_vectors.json
by scripts/make_golden_vectors.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdplan import (
    UnsupportedPDLayoutError,
    decode_transfer_fragments,
    encode_transfer_fragments,
)

from layouts import plan_to_dict, planner_from_spec
from oracle import check_plan, expected_fanout

GOLDEN = json.loads((Path(__file__).parent / "data" / "golden_vectors.json").read_text())
CASES = GOLDEN["cases"]


def by_outcome(outcome: str) -> list[Any]:
    return [pytest.param(case, id=case["name"]) for case in CASES if case["outcome"] == outcome]


def test_the_vectors_cover_every_outcome() -> None:
    outcomes = {case["outcome"] for case in CASES}
    assert outcomes == {"planned", "rejected", "crashed"}
    assert sum(case["outcome"] == "planned" for case in CASES) >= 100


@pytest.mark.parametrize("case", by_outcome("planned"))
def test_plans_equal_the_reference(case: dict[str, Any]) -> None:
    planner = planner_from_spec(case["layout"])
    world = case["layout"]["decode"]["world_size"]
    plans = [planner.plan_for_decode_rank(rank) for rank in range(world)]
    assert [plan_to_dict(p) for p in plans] == case["plans"]
    assert [list(item) for item in planner.source_fanout.items()] == case["source_fanout"]
    # The reference also plans replicated buffers whose decode item cannot hold the buffer; the
    # verifier names those as gaps and passes everything else.
    cramped = [
        row
        for row in case["layout"]["decode_buffers"]
        if row[2] == "replicated" and row[6] < row[3] * row[5]
    ]
    if cramped:
        with pytest.raises(UnsupportedPDLayoutError, match="gap"):
            planner.verify()
    else:
        planner.verify()


@pytest.mark.parametrize("case", by_outcome("planned"))
def test_wire_frames_equal_the_reference(case: dict[str, Any]) -> None:
    planner = planner_from_spec(case["layout"])
    frames = iter(case["frames"])
    for rank in range(case["layout"]["decode"]["world_size"]):
        plan = planner.plan_for_decode_rank(rank)
        for prefill_rank, fragments in plan.fragments_by_prefill_rank.items():
            expected = next(frames)
            assert expected["prefill_rank"] == prefill_rank
            version, payload = encode_transfer_fragments(fragments)
            assert version == expected["version"].encode("ascii")
            assert payload == expected["payload"].encode("utf-8")
            assert decode_transfer_fragments(version, payload) == fragments
    assert next(frames, None) is None


@pytest.mark.parametrize("case", by_outcome("rejected"))
def test_layouts_the_reference_rejects_are_rejected(case: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedPDLayoutError):
        planner_from_spec(case["layout"])


@pytest.mark.parametrize("case", by_outcome("crashed"))
def test_more_decode_dp_groups_than_prefill_now_plan_by_wrapping(case: dict[str, Any]) -> None:
    """The reference crashes (KeyError) when decode has more DP groups; pdplan reads decode DP
    group g from prefill DP group g % prefill dp_size, and the oracle checks every byte."""
    layout = case["layout"]
    assert layout["decode"]["dp_size"] > layout["prefill"]["dp_size"]
    planner = planner_from_spec(layout)
    sides = (
        planner.prefill_layout,
        planner.decode_layout,
        planner.prefill_buffers,
        planner.decode_buffers,
    )
    fanout = expected_fanout(*sides)
    assert planner.source_fanout == fanout
    for rank in range(layout["decode"]["world_size"]):
        plan = planner.plan_for_decode_rank(rank)
        check_plan(plan, planner.transfer_fragments(rank), rank, *sides, fanout)
    planner.verify()

"""Build pdplan objects from the plain layout specs used by golden vectors and properties."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pdplan import (
    BufferKind,
    BufferLayout,
    ParallelLayout,
    PDTransferPlanner,
    RankTransferPlan,
    TransferFragment,
    _core,
)

#: Fields pdplan's fragments have beyond the reference's (wire format v2 on), with defaults.
EXTRA_FIELDS = {
    name: _core.TRANSFER_FRAGMENT_DEFAULTS[name]
    for name, since in _core.TRANSFER_FRAGMENT_SINCE
    if since > 1
}


def buffers(rows: list[list[Any]]) -> tuple[BufferLayout, ...]:
    return tuple(BufferLayout(row[0], BufferKind(row[1]), *row[2:]) for row in rows)


def planner_from_spec(spec: dict[str, Any]) -> PDTransferPlanner:
    return PDTransferPlanner(
        prefill_layout=ParallelLayout("prefill", **spec["prefill"]),
        decode_layout=ParallelLayout("decode", **spec["decode"]),
        prefill_buffers=buffers(spec["prefill_buffers"]),
        decode_buffers=buffers(spec["decode_buffers"]),
    )


def fragment_to_dict(fragment: TransferFragment) -> dict[str, Any]:
    """The reference's fields: a head-major plan's fragments carry the row defaults only."""
    assert isinstance(fragment.buffer_kind, BufferKind)
    fields = {**asdict(fragment), "buffer_kind": fragment.buffer_kind.value}
    extra = {name: fields.pop(name) for name in EXTRA_FIELDS}
    assert extra == EXTRA_FIELDS, f"a reference-compatible fragment with more: {fragment}"
    return fields


def plan_to_dict(plan: RankTransferPlan) -> dict[str, Any]:
    """The golden-vector form: dicts as ordered pairs so their order is compared too."""
    return {
        "plan_kind": plan.plan_kind,
        "target_dp_group": plan.target_dp_group,
        "target_prefill_ranks": list(plan.target_prefill_ranks),
        "required_prefill_response_num": plan.required_prefill_response_num,
        "fragments_by_prefill_rank": [
            [rank, [fragment_to_dict(f) for f in fragments]]
            for rank, fragments in plan.fragments_by_prefill_rank.items()
        ],
        "required_dst_info_num_by_prefill_rank": [
            list(item) for item in plan.required_dst_info_num_by_prefill_rank.items()
        ],
    }

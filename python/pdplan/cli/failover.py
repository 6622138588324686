"""What ``pdplan check --unavailable-prefill-rank N`` prints: per decode DP group, who still
serves each decode rank, the new largest fanout, and what is lost (layers and heads)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pdplan._model import BufferLayout
from pdplan._planner import LostRange, PDTransferPlanner

#: What a buffer's logical units are called, by axis.
UNIT_NAMES = {"kv_head": ("head", "heads"), "state_channel": ("channel", "channels")}


def spans(numbers: Iterable[int]) -> str:
    """Ascending integers as inclusive runs: ``0-3, 7``."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def describe_lost(lost: Sequence[LostRange], buffers: Sequence[BufferLayout]) -> str:
    """Lost ranges as a person reads them: ``head 1 of layer(s) 0-79 (target_k, target_v)``;
    buffers that lose the same units together, and units lost by the same buffers together."""
    by_index = {b.buffer_index: b for b in buffers}
    # (axis, units, share) -> the buffers losing them
    buffers_of: dict[tuple[str, tuple[int, int], int | None], set[int]] = {}
    for r in lost:
        key = (by_index[r.buffer_index].logical_axis, (r.unit_start, r.unit_end), r.cp_share)
        buffers_of.setdefault(key, set()).add(r.buffer_index)
    # (axis, share, buffers) -> the unit ranges they lose
    units_of: dict[tuple[str, int | None, frozenset[int]], list[tuple[int, int]]] = {}
    for (kind_of_unit, run, share_of_run), losing in buffers_of.items():
        units_of.setdefault((kind_of_unit, share_of_run, frozenset(losing)), []).append(run)
    parts = []
    for (axis, share, indexes), ranges in units_of.items():
        if axis in UNIT_NAMES:
            one, many = UNIT_NAMES[axis]
            several = len(ranges) > 1 or ranges[0][1] - ranges[0][0] > 1
            runs = ", ".join(str(a) if b - a == 1 else f"{a}-{b - 1}" for a, b in ranges)
            named = f"{many if several else one} {runs}"
        else:
            named = "all"
        chosen = [by_index[i] for i in sorted(indexes)]
        layers = {b.layer for b in chosen if b.layer is not None}
        where = f"layer(s) {spans(layers)}" if layers else f"buffer(s) {spans(indexes)}"
        kinds = sorted({b.buffer_kind.value for b in chosen})
        tokens = f", tokens of CP share {share}" if share is not None else ""
        parts.append(f"{named} of {where} ({', '.join(kinds)}){tokens}")
    return "; ".join(parts)


def failover_lines(
    planner: PDTransferPlanner, failover: PDTransferPlanner
) -> tuple[list[str], bool]:
    """The report of `failover` (planned without some prefill ranks) against `planner`, and
    whether any decode rank loses bytes."""
    gone = failover.unavailable_prefill_ranks
    prefill, decode = failover.prefill_layout, failover.decode_layout
    lines = [f"failover: prefill rank(s) {spans(gone)} unavailable"]
    if len(gone) == prefill.world_size:
        lines.append("  every prefill rank is unavailable: nothing can be served")
    per_decode_group = decode.world_size // decode.dp_size
    gone_groups = {prefill.rank_coordinates(r).dp_group for r in gone}
    untouched: list[int] = []
    any_lost = False
    for group in range(decode.dp_size):
        ranks = range(group * per_decode_group, (group + 1) * per_decode_group)
        source = failover.plan_for_decode_rank(ranks[0]).target_dp_group
        if source not in gone_groups:
            untouched.append(group)
            continue
        lines.append(f"  decode DP group {group} (reads prefill DP group {source}):")
        for rank in ranks:
            now = failover.plan_for_decode_rank(rank).target_prefill_ranks
            before = planner.plan_for_decode_rank(rank).target_prefill_ranks
            served = f"from prefill rank(s) {spans(now)}" if now else "from nobody"
            if now != before:
                served += f" (was {spans(before) or 'nobody'})"
            lost = failover.lost(rank)
            any_lost = any_lost or bool(lost)
            what = describe_lost(lost, failover.decode_buffers) if lost else "nothing"
            lines.append(f"    decode rank {rank}: {served}; lost: {what}")
    if untouched:
        lines.append(
            f"  decode DP group(s) {spans(untouched)}: every prefill rank they read is up; "
            "plans unchanged"
        )
    largest = max(failover.source_fanout.values(), default=0)
    was = max(planner.source_fanout.values(), default=0)
    lines.append(f"largest fanout: {largest} (was {was}); unavailable ranks send nothing")
    if any_lost:
        lines.append(
            "incomplete: no prefill rank still up holds the lost bytes; recompute those layers "
            "on the decode side or drop the request (exit 2)"
        )
    else:
        lines.append("complete: every byte is read from a prefill rank still up")
    return lines, any_lost


__all__ = ["describe_lost", "failover_lines", "spans"]

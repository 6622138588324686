"""What the command prints: the model lines, the table, JSON, routing JSON and dot."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import TextIO

from pdplan._core import encode_transfer_fragments
from pdplan._layouts import (
    LayerKindSummary,
    ModelShape,
    model_families,
)
from pdplan._model import ParallelLayout, UnsupportedPDLayoutError
from pdplan._planner import PDTransferPlanner
from pdplan._request import PairRequest, page_sizes, request_pairs
from pdplan._staging import CostModel
from pdplan.cli.arguments import UserError

#: The request `plan` and `check` count descriptors for.
REQUEST_TOKENS = 32768


def _layer_ranges(summary: LayerKindSummary, most: int = 6) -> str:
    """Where a kind's layers are, the first few ranges of them when there are many."""
    ranges = summary.where().split(", ")
    if len(ranges) <= most:
        return ", ".join(ranges)
    return ", ".join(ranges[:most]) + f", ... {summary.layers[-1]}"


def model_lines(
    shape: ModelShape, name: str | None = None, tokens: int = REQUEST_TOKENS
) -> list[str]:
    """The model (its name and the family that read it), per layer kind (what each keeps, and
    where), and the KV bytes one request of `tokens` tokens keeps with and without its
    sliding windows and attention chunks."""
    kv = shape.kv_cache_dtype or shape.dtype
    state = shape.state_dtype or shape.dtype
    named = " ".join(
        part
        for part in (name, f"(family {shape.family})" if shape.family else None)
        if part is not None
    )
    lines = [
        f"model: {named + ': ' if named else ''}{shape.num_layers} layers ({shape.dtype}; "
        f"KV cache {kv}, states {state})"
    ]
    whole = windowed = 0
    selections = set()
    for kind in shape.summary():
        keeps = []
        if kind.token_bytes:
            keeps.append(f"{kind.token_bytes:,} B a token")
        if kind.entry_bytes:
            keeps.append(f"{kind.entry_bytes:,} B an entry of {kind.compress_ratio} tokens")
        if kind.state_bytes:
            keeps.append(f"{kind.state_bytes:,} B of state a request")
        what = "; ".join(keeps) or "no cache"
        lines.append(
            f"  {len(kind.layers):>4} x {kind.label}: {what}; layers {_layer_ranges(kind)}"
        )
        compressed = kind.compressed_bytes(tokens) * len(kind.layers)
        whole += kind.token_bytes * len(kind.layers) * tokens + compressed
        windowed += kind.token_bytes * len(kind.layers) * kind.kept_tokens(tokens) + compressed
        if kind.sliding_window is not None:
            selections.add("sliding windows")
        if kind.attention_chunk_size is not None:
            selections.add("attention chunks")
    if windowed != whole:
        lines.append(
            f"a {tokens // 1024}k-token request's KV: {windowed / 2**30:.2f} GiB moved with "
            f"{' and '.join(sorted(selections, reverse=True))}, {whole / 2**30:.2f} GiB without"
        )
    return lines


def print_families(output_format: str) -> None:
    """The registry, one family a paragraph (or as JSON)."""
    families = model_families()
    if output_format == "json":
        json.dump([asdict(f) for f in families], sys.stdout, indent=2)
        print()
        return
    for family in families:
        print(f"{family.name}: {', '.join(family.architectures)}")
        print(f"  model types: {', '.join(family.model_types)}")
        print(f"  cache keys read: {', '.join(family.keys)}")
        for key, why in family.ignored:
            print(f"  ignored: {key} ({why})")
        if family.presets:
            print(f"  presets: {', '.join(family.presets)}")
        print(f"  rule: {family.source}")


def idle_note(planner: PDTransferPlanner) -> str:
    """What the runtime must do for decode ranks that receive nothing (empty when none)."""
    idle = planner.idle_decode_ranks
    if not idle:
        return ""
    return (
        f"{idle} of {planner.decode_layout.world_size} decode ranks receive nothing "
        "(decode TP is above the KV-head count and only the first rank of each replica group "
        "receives): the runtime must copy inside each group after the transfer, or plan with "
        "--decode-replicas all"
    )


def chosen_ranks(args: argparse.Namespace, planner: PDTransferPlanner) -> list[int]:
    """The decode ranks to show: those asked for (in order, once each), else all."""
    world = planner.decode_layout.world_size
    if not args.decode_rank:
        return list(range(world))
    for rank in args.decode_rank:
        try:
            planner.decode_layout.rank_coordinates(rank)
        except UnsupportedPDLayoutError as error:
            raise UserError(f"--decode-rank: {error}") from None
    return list(dict.fromkeys(args.decode_rank))


def _header(shape: ModelShape, planner: PDTransferPlanner) -> str:
    """The JSON members both formats start with, as text to stream."""
    head = {
        "prefill": asdict(planner.prefill_layout),
        "decode": asdict(planner.decode_layout),
        "model": shape.to_dict(),
        "buffers": len(planner.prefill_buffers),
    }
    return json.dumps(head)[:-1]


def write_plan_json(
    out: TextIO, shape: ModelShape, planner: PDTransferPlanner, ranks: Sequence[int]
) -> None:
    """Every fragment of the chosen ranks, streamed rank by rank: each rank's fragments are
    written by the wire encoder in Rust (the same keys, in field order), never held at once."""
    out.write(_header(shape, planner) + ',\n"plans": [')
    for position, rank in enumerate(ranks):
        plan = planner.plan_for_decode_rank(rank)
        entry = {
            "decode_rank": rank,
            "plan_kind": plan.plan_kind,
            "target_dp_group": plan.target_dp_group,
            "target_prefill_ranks": list(plan.target_prefill_ranks),
            "required_dst_info_num_by_prefill_rank": {
                str(r): n for r, n in plan.required_dst_info_num_by_prefill_rank.items()
            },
        }
        out.write(("," if position else "") + "\n" + json.dumps(entry)[:-1] + ', "fragments": {')
        for index, (source, fragments) in enumerate(plan.fragments_by_prefill_rank.items()):
            payload = encode_transfer_fragments(fragments)[1].decode("ascii")
            out.write(f'{", " if index else ""}"{source}": {payload}')
        out.write("}}")
    fanout = {str(r): n for r, n in planner.source_fanout.items()}
    out.write('\n],\n"source_fanout": ' + json.dumps(fanout) + "}\n")


def write_routing_json(
    out: TextIO, shape: ModelShape, planner: PDTransferPlanner, ranks: Sequence[int]
) -> None:
    """Who talks to whom: one row per (decode rank, prefill rank) pair (notify-only pairs have
    0 fragments and 0 bytes), and the fanout."""
    pairs = [
        {"decode_rank": d, "prefill_rank": p, "fragments": n, "bytes_per_page": b}
        for d, p, n, b in _routing_rows(planner, ranks)
    ]
    out.write(_header(shape, planner) + ',\n"pairs": [')
    out.write(",\n".join(json.dumps(pair) for pair in pairs))
    fanout = {str(r): n for r, n in planner.source_fanout.items()}
    out.write('],\n"source_fanout": ' + json.dumps(fanout) + "}\n")


def _routing_rows(
    planner: PDTransferPlanner, ranks: Sequence[int] | None = None
) -> list[tuple[int, int, int, int]]:
    table = planner.routing_table()
    rows = zip(
        table.decode_rank.tolist(),
        table.prefill_rank.tolist(),
        table.fragment_count.tolist(),
        table.bytes_per_page.tolist(),
    )
    if ranks is None:
        return list(rows)
    by_rank: dict[int, list[tuple[int, int, int, int]]] = {rank: [] for rank in ranks}
    for row in rows:
        if row[0] in by_rank:
            by_rank[row[0]].append(row)
    return [row for rank in ranks for row in by_rank[rank]]


def print_table(
    shape: ModelShape,
    planner: PDTransferPlanner,
    model: CostModel,
    chunk_bytes: int | None,
    ranks: Sequence[int] | None = None,
    name: str | None = None,
) -> None:
    p, d = planner.prefill_layout, planner.decode_layout

    def sizes(layout: ParallelLayout) -> str:
        stages = f" x PP {layout.pp_size}" if layout.pp_size > 1 else ""
        cp = f" x CP {layout.cp_size}" if layout.cp_size > 1 else ""
        dcp = f" (DCP {layout.dcp_size})" if layout.dcp_size > 1 else ""
        return f"{layout.dp_size} DP{stages}{cp} x TP {layout.tp_size_per_dp}{dcp}"

    try:
        pages = page_sizes(planner)
    except UnsupportedPDLayoutError:
        several = sorted({b.page_size for b in planner.prefill_buffers})
        page_text = f"pages of {', '.join(map(str, several))} items (a page table a cache group)"
    else:
        page_text = (
            f"{pages[0]}-token pages"
            if pages[0] == pages[1]
            else f"{pages[0]}-token prefill pages, {pages[1]}-token decode pages (token maps)"
        )
    for line in model_lines(shape, name):
        print(line)
    print(
        f"prefill {p.world_size} ranks ({sizes(p)}) -> decode {d.world_size} ranks "
        f"({sizes(d)}); {len(planner.prefill_buffers)} buffers, {page_text}"
    )
    kind = planner.plan_for_decode_rank(0).plan_kind
    print(f"plan kind: {kind}" + (" (whole items, rank to rank)" if kind == "identity" else ""))
    if note := idle_note(planner):
        print(f"note: {note}")
    if line := context_line(planner):
        print(line)
    for line in request_lines(planner, model, chunk_bytes):
        print(line)
    print()
    staged = planner.is_staged

    def rank(layout: ParallelLayout, number: int) -> str:
        """A rank, with its pipeline stage when stages are in play."""
        if not staged:
            return str(number)
        return f"{number} (stage {layout.rank_coordinates(number).stage})"

    width = 18 if staged else 12
    print(
        f"{'decode rank':>{width}}  {'prefill rank':>{width}}  {'fragments':>9}  {'bytes/page':>12}"
    )
    for decode_rank, prefill_rank, count, nbytes in _routing_rows(planner, ranks):
        moved = f"{count:>9}  {nbytes:>12,}" if count else f"{'notify':>9}  {'':>12}"
        print(f"{rank(d, decode_rank):>{width}}  {rank(p, prefill_rank):>{width}}  {moved}")
    print()
    fanout = planner.source_fanout
    print("fanout (decode ranks each prefill rank waits for, per request):")
    print("  " + ", ".join(f"{rank}: {n}" for rank, n in fanout.items()))


def seconds_text(value: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value * 1e6:.3g} µs"


def request_lines(
    planner: PDTransferPlanner, model: CostModel, chunk_bytes: int | None = None
) -> list[str]:
    """The request line, then each group of alike rank pairs with the cost model's choice."""
    try:
        page_sizes(planner)
    except UnsupportedPDLayoutError as refused:
        return [f"a {REQUEST_TOKENS // 1024}k-token request: not estimated here: {refused}"]
    pairs = list(request_pairs(planner, REQUEST_TOKENS, model, chunk_bytes))
    total = sum(p.descriptors for p in pairs)
    total_bytes = sum(p.bytes for p in pairs)
    way = "slot maps" if planner.token_maps else "pages"
    each = f", {total_bytes // total:,} B a descriptor" if total else ""
    lines = [
        f"a {REQUEST_TOKENS // 1024}k-token request to decode DP group 0 (scattered pages, by "
        f"{way}): {total:,} descriptors moving {total_bytes / 2**30:.2f} GiB over {len(pairs)} "
        f"rank pairs{each}"
    ]
    if not pairs:
        return lines
    lines.append(
        f"staging it, per rank pair (cost model: {model.per_descriptor_s * 1e6:g} µs a "
        f"descriptor, {model.network_bytes_per_s * 8 / 1e9:g} Gb/s wire, copies at "
        f"{model.copy_bytes_per_s / 1e9:g} GB/s + {model.per_copy_s * 1e6:g} µs; --help lists "
        "the flags):"
    )
    groups: dict[tuple[int, int, int, str], list[PairRequest]] = {}
    for p in pairs:
        e = p.estimate
        groups.setdefault((p.descriptors, p.bytes, e.wire_descriptors, e.choice), []).append(p)
    for (count, nbytes, transfers, choice), members in groups.items():
        e = members[0].estimate
        named = ", ".join(f"{m.decode_rank}<-{m.prefill_rank}" for m in members[:4])
        more = f" and {len(members) - 4} more" if len(members) > 4 else ""
        size = f"{nbytes // count:,} B" if count else "0 B"
        lines.append(
            f"  decode<-prefill {named}{more} ({len(members)} pairs): {count:,} descriptors of "
            f"{size}; direct {seconds_text(e.direct_s)}, staged {seconds_text(e.staging_s)} in "
            f"{transfers:,} descriptor(s) -> {choice}"
        )
    return lines + form_lines(pairs, model)


def form_lines(pairs: list[PairRequest], model: CostModel) -> list[str]:
    """Each group of alike rank pairs' descriptor forms on consecutive pages, and the one the
    cost model chooses (flat, NIXL 1.5's strided lists, or staged)."""
    lines = [
        f"descriptor forms, its pages consecutive (a fresh allocator's; {model.per_row_s * 1e6:g}"
        f" µs a strided row, {model.per_block_s * 1e6:g} µs a block of a row):"
    ]
    groups: dict[tuple[object, ...], list[PairRequest]] = {}
    for p in pairs:
        f = p.forms
        groups.setdefault((f.descriptors, f.strided_rows, f.bytes, f.form), []).append(p)
    for members in groups.values():
        f = members[0].forms
        named = ", ".join(f"{m.decode_rank}<-{m.prefill_rank}" for m in members[:4])
        more = f" and {len(members) - 4} more" if len(members) > 4 else ""
        staged = "" if f.staging_s is None else f", staged {seconds_text(f.staging_s)}"
        strided = "" if f.strided_s is None else (
            f", strided {seconds_text(f.strided_s)} in {f.strided_rows:,} rows"
        )  # fmt: skip
        lines.append(
            f"  decode<-prefill {named}{more} ({len(members)} pairs): flat "
            f"{seconds_text(f.flat_s)} in {f.descriptors:,} descriptors{strided}{staged} -> "
            f"{f.form} ({seconds_text(f.seconds)})"
        )
    return lines


def context_line(planner: PDTransferPlanner) -> str:
    """How the sides spread tokens and what that costs a decode rank (empty without CP)."""

    def spread(layout: ParallelLayout) -> str | None:
        if layout.dcp_size > 1:
            return f"DCP {layout.dcp_size} (interleave {layout.cp_interleave})"
        if layout.cp_size > 1:
            how: str = "replicas" if layout.cp_kv == "replicated" else layout.cp_split
            if how == "interleave":
                how = f"interleave {layout.cp_interleave}"
            return f"CP {layout.cp_size} ({how})"
        return None

    sides = [spread(planner.prefill_layout), spread(planner.decode_layout)]
    if sides == [None, None]:
        return ""
    plan = planner.plan_for_decode_rank(0, num_tokens=REQUEST_TOKENS)
    fanout = max(plan.required_dst_info_num_by_prefill_rank.values(), default=0)
    return (
        f"context parallelism: prefill {sides[0] or 'none'}, decode {sides[1] or 'none'}; for a "
        f"{REQUEST_TOKENS // 1024}k-token request decode rank 0 reads from "
        f"{plan.required_prefill_response_num} prefill rank(s) (largest fanout {fanout})"
    )


def print_dot(planner: PDTransferPlanner, ranks: Sequence[int]) -> None:
    rows = _routing_rows(planner, ranks)
    print("digraph pdplan {")
    print("  rankdir=LR;")
    for rank in sorted({row[1] for row in rows}):
        print(f'  "P{rank}" [shape=box, label="prefill {rank}"];')
    for rank in ranks:
        print(f'  "D{rank}" [shape=ellipse, label="decode {rank}"];')
    for decode_rank, prefill_rank, count, nbytes in rows:
        if count == 0:  # the prefill rank sends nothing but must hear "done"
            print(f'  "P{prefill_rank}" -> "D{decode_rank}" [label="notify", style=dashed];')
            continue
        print(
            f'  "P{prefill_rank}" -> "D{decode_rank}" [label="{nbytes} B/page, {count} fragments"];'
        )
    print("}")

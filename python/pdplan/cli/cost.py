"""``pdplan cost``: what one request costs a pairing, for a router (``pdplan.Pairing``)."""

from __future__ import annotations

import argparse
import json
import sys

from pdplan._layouts import ModelShape
from pdplan._staging import CostModel
from pdplan._transfer_cost import Pairing, TransferCost
from pdplan.cli.deployment import Deployment
from pdplan.cli.formats import seconds_text


def pairing_of(args: argparse.Namespace, shape: ModelShape, model: CostModel) -> Pairing:
    """The pairing the flags describe."""
    deployment = Deployment.from_args(args)
    return Pairing(shape, *deployment.sides(), cost_model=model, **deployment.options())


def cost_lines(cost: TransferCost) -> list[str]:
    """The request, its totals, then each group of alike rank pairs."""
    held = f", {cost.decode_prefix:,} held by the decode side" if cost.decode_prefix else ""
    lines = [
        f"a {cost.tokens:,}-token request to decode DP group {cost.decode_dp_group}{held}: "
        f"{cost.moved_tokens:,} tokens move by {cost.by} (scattered pages)",
        f"  {len(cost.pairs)} rank pairs, {cost.descriptors:,} descriptors, "
        f"{cost.bytes / 2**30:.3f} GiB ({cost.bytes:,} B), largest fanout {cost.largest_fanout}",
        f"  cost model: {seconds_text(cost.seconds)} (the busiest rank, its pairs in turn)",
    ]
    groups: dict[tuple[int, int, str], list[str]] = {}
    for p in cost.pairs:
        key = (p.descriptors, p.bytes, seconds_text(p.seconds))
        groups.setdefault(key, []).append(f"{p.decode_rank}<-{p.prefill_rank}")
    for (descriptors, nbytes, took), names in groups.items():
        more = f" and {len(names) - 4} more" if len(names) > 4 else ""
        lines.append(
            f"  decode<-prefill {', '.join(names[:4])}{more} ({len(names)} pairs): "
            f"{descriptors:,} descriptors, {nbytes:,} B, {took}"
        )
    return lines


def cost_json(cost: TransferCost) -> dict[str, object]:
    """The cost as JSON: totals and every pair."""
    return {
        "tokens": cost.tokens,
        "decode_prefix": cost.decode_prefix,
        "moved_tokens": cost.moved_tokens,
        "by": cost.by,
        "decode_dp_group": cost.decode_dp_group,
        "descriptors": cost.descriptors,
        "bytes": cost.bytes,
        "largest_fanout": cost.largest_fanout,
        "seconds": cost.seconds,
        "pairs": [
            {
                "decode_rank": p.decode_rank,
                "prefill_rank": p.prefill_rank,
                "descriptors": p.descriptors,
                "bytes": p.bytes,
                "seconds": p.seconds,
                "choice": p.estimate.choice,
            }
            for p in cost.pairs
        ],
    }


def print_cost(args: argparse.Namespace, shape: ModelShape, model: CostModel) -> None:
    cost = pairing_of(args, shape, model).cost(args.tokens, decode_prefix=args.decode_prefix)
    if args.format == "json":
        json.dump(cost_json(cost), sys.stdout, indent=2)
        print()
        return
    print("\n".join(cost_lines(cost)))

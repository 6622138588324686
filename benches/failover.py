"""Failover: what planning around gone prefill ranks costs, beside construction, in one run.

    python benches/failover.py [--callgrind] [--repeat N]

The scale issue's world (4096 prefill ranks as 256 DP groups of TP 16, 1024 decode ranks as
256 x TP 4, 8 KV heads, K and V of every layer), at 20, 80 and 320 layers: construction, then
`without_prefill_ranks` for sets of gone ranks that need one rehoming (one rank; a whole
replica group, which loses a head; the same slot in 64 DP groups) and sixteen (a different
slot in every one of the 256 groups), and a plan of a decode rank reading a group with a gone
rank beside one of a group without. The reference planner has no failover, so there is no
pure-Python column: the ratio that matters is failover against construction, which should
stay flat as buffers grow (the work is decode slots x classes per distinct set of gone slots).
--callgrind adds instruction counts (valgrind) for construction and a one-rank failover.
Writes benches/results/failover.md.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import callgrind
import provenance
from scenarios import Scenario, cluster

RESULTS = provenance.RESULTS
GROUP = 16  # prefill ranks a DP group (TP 16)


def gone_sets() -> dict[str, list[int]]:
    return {
        "1 rank (its replica serves)": [0],
        "a replica group (head 0 lost)": [0, 1],
        "slot 3 of 64 DP groups (1 rehoming)": [g * GROUP + 3 for g in range(64)],
        "1 rank in each of 256 groups (16 rehomings)": [g * GROUP + g % GROUP for g in range(256)],
    }


def best_of(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


def world(layers: int) -> Scenario:
    return cluster(256, GROUP, 256, 4, layers=layers)


def table(repeat: int) -> str:
    rows = [
        "| layers (buffers) | construction | gone | failover | failover / construction |",
        "| ---: | ---: | --- | ---: | ---: |",
    ]
    plans = []
    for layers in (20, 80, 320):
        s = world(layers)
        planner = s.planner()
        built = best_of(s.planner, repeat)
        for name, gone in gone_sets().items():
            took = best_of(partial(planner.without_prefill_ranks, gone), repeat)
            rows.append(
                f"| {layers} ({2 * layers}) | {fmt(built)} | {name} | {fmt(took)} | "
                f"{took / built:.2f}x |"
            )
        failover = planner.without_prefill_ranks([0])
        assert (
            failover.lost(0) == [] and failover.plan_for_decode_rank(0).target_prefill_ranks[0] == 1
        )
        # Decode rank 0 reads prefill group 0 (rank 0 gone); decode rank 4 reads group 1.
        base = best_of(partial(planner.plan_for_decode_rank, 0), repeat)
        around = best_of(partial(failover.plan_for_decode_rank, 0), repeat)
        other = best_of(partial(failover.plan_for_decode_rank, 4), repeat)
        plans.append(
            f"| {layers} ({2 * layers}) | {fmt(base)} | {fmt(around)} ({around / base:.2f}x) | "
            f"{fmt(other)} ({other / base:.2f}x) |"
        )
    return "\n".join(
        [
            "Building a failover planner (best of "
            f"{repeat}), against building the planner itself, on 4096 -> 1024 ranks:",
            "",
            *rows,
            "",
            "One decode rank's plan (`plan_for_decode_rank`), with prefill rank 0 gone:",
            "",
            "| layers (buffers) | planner of every rank | reading the group with rank 0 gone | "
            "reading another group |",
            "| ---: | ---: | ---: | ---: |",
            *plans,
        ]
    )


COUNT_SCRIPT = """
import sys
sys.path.insert(0, {benches!r})
from scenarios import cluster
s = cluster(256, 16, 256, 4, layers=int(sys.argv[2]))
planner = s.planner()
for _ in range(int(sys.argv[-1])):
    if sys.argv[1] == "construction":
        s.planner()
    else:
        planner.without_prefill_ranks([0])
"""


def counts() -> str:
    script = COUNT_SCRIPT.format(benches=str(provenance.ROOT / "benches"))
    found = []
    for layers in (20, 320):
        built = callgrind.instructions(script, ["construction", str(layers)], 5)
        failover = callgrind.instructions(script, ["failover", str(layers)], 5)
        found.append(
            f"{layers} layers: construction {built:,.0f}, failover of 1 rank {failover:,.0f} "
            f"({failover / built:.2f}x)"
        )
    return "Instructions per call (valgrind --tool=callgrind): " + "; ".join(found) + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--callgrind", action="store_true", help="add instruction counts")
    args = parser.parse_args()
    text = table(args.repeat)
    if args.callgrind:
        text += "\n\n" + counts()
    print(text)
    provenance.write("failover.md", text)


if __name__ == "__main__":
    main()

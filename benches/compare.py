"""Side by side, in one run: pdplan against the pure-Python way on the scale issue's world.

    pip install '.[bench]' && python benches/compare.py [--reference path/to/transfer_plan.py]

Prints a markdown table (times are the best of several runs; ratio = pure Python / pdplan),
the peak memory of a 65,536-rank planner, and writes docs/images/scaling.png: the time to
plan a whole cluster (construction + every decode rank's plan) against world size.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import astuple
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import pdplan
from pdplan import _core

import provenance
import pure_python
from scenarios import Scenario, cluster, large_world, llama70b_request

RESULTS = provenance.RESULTS
#: The floors `large_world_table` measured, and pdplan's times beside them.
FLOORS: dict[str, float] = {}


def best_of(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Best time of `repeat` runs, each starting from a collected heap: neither the previous
    run's result nor the garbage collector's backlog is charged to the next one."""
    best, result = float("inf"), None
    for _ in range(repeat):
        result = None
        gc.collect()
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return best, result


def same_plan(ours: pdplan.RankTransferPlan, theirs: pure_python.Plan) -> bool:
    def fields(p: Any) -> tuple[Any, ...]:
        return (
            p.plan_kind,
            p.target_dp_group,
            p.target_prefill_ranks,
            p.required_prefill_response_num,
            p.required_dst_info_num_by_prefill_rank,
            {r: [astuple(f)[:10] for f in fs] for r, fs in p.fragments_by_prefill_rank.items()},
        )

    return fields(ours) == fields(theirs)


def large_world_table(repeat: int) -> list[dict[str, Any]]:
    s = large_world()
    ranks = range(s.decode.world_size)
    rows = []

    t_walk, walk = best_of(lambda: pure_python.WalkingPlanner(*s.args), max(1, repeat // 2))
    t_arith, arith = best_of(lambda: pure_python.ArithmeticPlanner(*s.args), repeat)
    t_ours, ours = best_of(lambda: s.planner(), repeat * 4)
    assert ours.source_fanout == walk.fanout == arith.fanout
    rows.append(row("construction (validation + source_fanout)", t_walk, t_arith, t_ours, 500))

    # Only one side's plans are alive while the other is timed; compared rank by rank after.
    t_walk, _ = best_of(lambda: [walk.plan_for_decode_rank(r) for r in ranks], repeat)
    t_arith, _ = best_of(lambda: [arith.plan_for_decode_rank(r) for r in ranks], repeat)
    t_ours, our_plans = best_of(lambda: [ours.plan_for_decode_rank(r) for r in ranks], repeat)
    assert all(same_plan(our_plans[r], walk.plan_for_decode_rank(r)) for r in ranks)
    rows.append(
        row(f"plan_for_decode_rank x {len(ranks)} (equal plans)", t_walk, t_arith, t_ours, 20)
    )

    lists = [fs for p in our_plans for fs in p.fragments_by_prefill_rank.values()]
    count = sum(len(fs) for fs in lists)
    t_plan = t_ours
    t_floor, _ = best_of(lambda: [_core.remake_fragments(fs) for fs in lists], repeat)
    t_py, py_frames = best_of(lambda: [pure_python.encode(fs) for fs in lists], repeat)
    t_ours, frames = best_of(lambda: [pdplan.encode_transfer_fragments(fs) for fs in lists], repeat)
    assert frames == py_frames
    t_encode = t_ours
    frame_floor = _core.FrameFloor(lists)
    t_frame_floor, written = best_of(frame_floor.write, repeat)
    assert written == sum(len(payload) for _, payload in frames)
    rows.append(
        row(
            f"encode_transfer_fragments ({len(lists)} lists, {count} fragments)",
            t_py,
            None,
            t_ours,
            5,
        )
    )

    t_py, _ = best_of(
        lambda: [pure_python.decode(v, p, pdplan.BufferKind) for v, p in frames], repeat
    )
    t_ours, decoded = best_of(
        lambda: [pdplan.decode_transfer_fragments(v, p) for v, p in frames], repeat
    )
    assert decoded == [tuple(fs) for fs in lists]
    rows.append(row("decode_transfer_fragments (same frames)", t_py, None, t_ours, 5))
    FLOORS.update(
        {
            "count": count,
            "lists": len(lists),
            "object_floor": t_floor,
            "frame_floor": t_frame_floor,
            "plan": t_plan,
            "encode": t_encode,
            "decode": t_ours,
        }
    )

    t_ours, _ = best_of(ours.verify, repeat)
    rows.append(row("verify() (every plan, byte-level)", None, None, t_ours, None))

    t_ours, table = best_of(ours.routing_table, repeat)
    rows.append(
        row(f"routing_table ({len(table.decode_rank)} rank pairs)", None, None, t_ours, None)
    )
    # The same cluster split into pipeline stages on both sides (no pure-Python planner plans
    # stages): construction must still cost ranks x classes, not ranks x buffers.
    staged = cluster(256, 8, 256, 2, prefill_pp=2, decode_pp=2)
    t_ours, staged_planner = best_of(staged.planner, repeat * 4)
    rows.append(
        row(
            "construction, PP 2 on both sides (256 x 2 x 8 -> 256 x 2 x 2)",
            None,
            None,
            t_ours,
            None,
        )
    )
    t_ours, staged_plans = best_of(
        lambda: [staged_planner.plan_for_decode_rank(r) for r in ranks], repeat
    )
    table = staged_planner.routing_table()
    pairs = int((table.fragment_count > 0).sum())  # notify-only rows move nothing
    assert sum(len(p.target_prefill_ranks) for p in staged_plans) == pairs
    notified = sum(len(p.notify_prefill_ranks) for p in staged_plans)
    assert notified == len(table.decode_rank) - pairs
    rows.append(
        row(f"plan_for_decode_rank x {len(ranks)}, PP 2 on both sides", None, None, t_ours, None)
    )
    t_ours, _ = best_of(staged_planner.verify, repeat)
    rows.append(row("verify(), PP 2 on both sides", None, None, t_ours, None))
    return rows


def row(
    name: str, walk: float | None, arith: float | None, ours: float, target: float | None
) -> dict[str, Any]:
    return {
        "operation": name,
        "pure_python": walk,
        "pure_python_arithmetic": arith,
        "pdplan": ours,
        "target": target,
    }


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def print_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| operation | pure Python (walk) | pure Python (pdplan's algorithm) | pdplan | "
        "ratio vs walk | ratio vs algorithm | target |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:

        def ratio(base: float | None, r: dict[str, Any] = r) -> str:
            return "—" if base is None else f"{base / r['pdplan']:,.1f}×"

        target = "—" if r["target"] is None else f"≥ {r['target']}×"
        lines.append(
            f"| {r['operation']} | {fmt_time(r['pure_python'])} | "
            f"{fmt_time(r['pure_python_arithmetic'])} | {fmt_time(r['pdplan'])} | "
            f"{ratio(r['pure_python'])} | {ratio(r['pure_python_arithmetic'])} | {target} |"
        )
    text = "\n".join(lines)
    print(text)
    return text


def floors_table() -> str:
    """pdplan's large-world times as multiples of what the work costs at the least here."""
    f = FLOORS
    lines = [
        "| operation | floor | floor measures | pdplan | multiple of the floor |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    for name, ours, floor, what in (
        (
            "plan_for_decode_rank x 1024",
            f["plan"],
            f["object_floor"],
            f"making {int(f['count']):,} TransferFragments through their slots, the values "
            "already Python ints (no planning)",
        ),
        (
            "decode_transfer_fragments (every frame)",
            f["decode"],
            f["object_floor"],
            "the same fragment objects made (no parsing)",
        ),
        (
            "encode_transfer_fragments (every list)",
            f["encode"],
            f["frame_floor"],
            f"writing the same {int(f['lists']):,} frames' bytes from Rust structs (no Python "
            "objects)",
        ),
    ):
        lines.append(
            f"| {name} | {fmt_time(floor)} | {what} | {fmt_time(ours)} | {ours / floor:,.2f}× |"
        )
    text = "\n".join(lines)
    print(text)
    return text


COUNT_SCRIPT = """
import sys
sys.path.insert(0, {benches!r})
from scenarios import large_world
import pdplan
s = large_world()
planner = s.planner()
op, n = sys.argv[1], int(sys.argv[2])
if op in ("encode_transfer_fragments", "decode_transfer_fragments"):
    plans = [planner.plan_for_decode_rank(r) for r in range(128)]
    lists = [fs for p in plans for fs in p.fragments_by_prefill_rank.values()]
    frames = [pdplan.encode_transfer_fragments(fs) for fs in lists] if op[0] == "d" else None
keep = []  # results stay alive, as in the timed runs: freeing them is not counted
for i in range(n):
    if op == "construction":
        keep.append(s.planner())
    elif op == "plan_for_decode_rank":
        keep.append(planner.plan_for_decode_rank(i % 1024))
    elif op == "encode_transfer_fragments":
        keep.append(pdplan.encode_transfer_fragments(lists[i]))  # each list once: no cache hit
    elif op == "decode_transfer_fragments":
        keep.append(pdplan.decode_transfer_fragments(*frames[i]))
    elif op == "routing_table":
        keep.append(planner.routing_table())
"""

#: Operation -> calls counted (each call is one decode rank, list or frame pair).
COUNTED = {
    "construction": 10,
    "plan_for_decode_rank": 200,
    "encode_transfer_fragments": 200,
    "decode_transfer_fragments": 200,
    "routing_table": 10,
}


def instruction_counts() -> dict[str, float]:
    """Instructions per call of each large-world operation (public API only, so the same
    script counts any build of pdplan)."""
    import callgrind

    script = COUNT_SCRIPT.format(benches=str(Path(__file__).parent))
    return {op: callgrind.instructions(script, [op], n) for op, n in COUNTED.items()}


def counts_table(counts: dict[str, float], before: dict[str, Any] | None) -> str:
    lines = ["Instructions per call (valgrind --tool=callgrind, the stable measure):", ""]
    if before is None:
        lines += ["| operation | instructions |", "| --- | ---: |"]
        lines += [f"| {op} | {n:,.0f} |" for op, n in counts.items()]
    else:
        lines += [
            f"| operation | before ({before['provenance']['commit']}) | now | fewer by |",
            "| --- | ---: | ---: | ---: |",
        ]
        for op, n in counts.items():
            old = before["counts"][op]
            lines.append(f"| {op} | {old:,.0f} | {n:,.0f} | {old / n:,.2f}× |")
    text = "\n".join(lines)
    print(text)
    return text


def reference_table(path: Path, repeat: int) -> str:
    """The same operations against the reference planner itself (not shipped with pdplan)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from make_golden_vectors import load_reference

    ref = load_reference(path)
    s = large_world()
    ranks = range(s.decode.world_size)

    def converted(buffers: Any) -> tuple[Any, ...]:
        return tuple(
            ref.BufferLayout(
                b.buffer_index,
                ref.BufferKind(b.buffer_kind.value),
                b.logical_axis,
                b.logical_size,
                b.page_size,
                b.bytes_per_logical_unit,
                b.item_stride_bytes,
                b.tp_replica_group_size,
            )
            for b in buffers
        )

    def build_reference() -> Any:
        return ref.PDTransferPlanner(
            prefill_layout=ref.ParallelLayout("prefill", s.prefill.world_size, s.prefill.dp_size),
            decode_layout=ref.ParallelLayout("decode", s.decode.world_size, s.decode.dp_size),
            prefill_buffers=converted(s.prefill_buffers),
            decode_buffers=converted(s.decode_buffers),
        )

    rows = []
    t_ref, theirs = best_of(build_reference, 1)
    t_ours, ours = best_of(s.planner, repeat * 4)
    rows.append(("construction", t_ref, t_ours, 500))
    t_ref, _ = best_of(lambda: [theirs.plan_for_decode_rank(r) for r in ranks], 1)
    t_ours, plans = best_of(lambda: [ours.plan_for_decode_rank(r) for r in ranks], repeat)
    rows.append((f"plan_for_decode_rank x {len(ranks)}", t_ref, t_ours, 40))
    lists = [fs for p in plans for fs in p.fragments_by_prefill_rank.values()]
    ref_lists = [
        fs
        for r in ranks
        for fs in theirs.plan_for_decode_rank(r).fragments_by_prefill_rank.values()
    ]
    plans = None
    t_ref, ref_frames = best_of(
        lambda: [ref.encode_transfer_fragments(f) for f in ref_lists], repeat
    )
    t_ours, frames = best_of(lambda: [pdplan.encode_transfer_fragments(f) for f in lists], repeat)
    assert frames == ref_frames, "pdplan's frames differ from the reference's"
    rows.append(("encode_transfer_fragments", t_ref, t_ours, 8))
    t_ref, _ = best_of(lambda: [ref.decode_transfer_fragments(v, p) for v, p in frames], repeat)
    t_ours, _ = best_of(lambda: [pdplan.decode_transfer_fragments(v, p) for v, p in frames], repeat)
    rows.append(("decode_transfer_fragments", t_ref, t_ours, 16))
    lines = [
        "| operation | reference transfer_plan.py | pdplan | ratio | target |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {name} | {fmt_time(a)} | {fmt_time(b)} | {a / b:,.1f}× | ≥ {target}× |"
        for name, a, b, target in rows
    ]
    text = "\n".join(lines)
    print(text)
    return text


def descriptor_table(repeat: int) -> str:
    """One 32k-token request of a 70B model, prefill TP 8 -> decode TP 2, one prefill rank."""
    r = llama70b_request()
    args = (r.fragments, r.src_bases, r.dst_bases, r.src_pages, r.dst_pages)
    limits = {"src_limits": r.src_limits, "dst_limits": r.dst_limits}
    t_loop, loop = best_of(lambda: pure_python.descriptors_loop(*args), max(1, repeat // 2))
    t_numpy, vec = best_of(lambda: pure_python.descriptors_numpy(*args), repeat * 4)
    t_ours, ours = best_of(
        lambda: pdplan.transfer_descriptors(*args, coalesce=False, **limits), repeat * 4
    )
    t_merged, merged = best_of(lambda: pdplan.transfer_descriptors(*args, **limits), repeat * 4)
    assert [tuple(row) for row in ours.as_array().tolist()] == loop
    assert all((a == b).all() for a, b in zip(ours, vec))
    n = len(loop)
    lines = [
        f"{len(r.fragments)} fragments x {len(r.src_pages)} pages = {n:,} descriptors",
        "",
        "| way | time | descriptors / s | pdplan is faster by |",
        "| --- | ---: | ---: | ---: |",
        f"| Python loop (list of tuples) | {fmt_time(t_loop)} | {n / t_loop:,.0f} | "
        f"{t_loop / t_ours:,.0f}× |",
        f"| numpy, one expression per fragment (no checks) | {fmt_time(t_numpy)} | "
        f"{n / t_numpy:,.0f} | {t_numpy / t_ours:,.1f}× |",
        f"| pdplan `transfer_descriptors(coalesce=False)`, with limits | {fmt_time(t_ours)} | "
        f"{n / t_ours:,.0f} | — |",
        f"| pdplan `transfer_descriptors()` (coalesced: {merged.num_descriptors:,} left) | "
        f"{fmt_time(t_merged)} | {n / t_merged:,.0f} | — |",
    ]
    text = "\n".join(lines)
    print(text)
    return text


def nhd_descriptor_table(repeat: int) -> str:
    """The same request with token-major (NHD) pages: one descriptor per page and token row."""
    r = llama70b_request(kv_layout="NHD")
    head_major = llama70b_request()
    args = (r.fragments, r.src_bases, r.dst_bases, r.src_pages, r.dst_pages)
    limits = {"src_limits": r.src_limits, "dst_limits": r.dst_limits}
    t_loop, loop = best_of(lambda: pure_python.descriptors_loop(*args), 1)
    t_numpy, vec = best_of(lambda: pure_python.descriptors_numpy(*args), repeat)
    t_ours, ours = best_of(
        lambda: pdplan.transfer_descriptors(*args, coalesce=False, **limits), repeat * 4
    )
    t_merged, merged = best_of(lambda: pdplan.transfer_descriptors(*args, **limits), repeat * 4)
    assert all((a == b).all() for a, b in zip(ours, vec))
    assert len(loop) == ours.num_descriptors
    assert [tuple(row) for row in ours.as_array()[::4099].tolist()] == loop[::4099]
    n = ours.num_descriptors
    hnd = len(head_major.fragments) * len(head_major.src_pages)
    lines = [
        f"{len(r.fragments)} row fragments x {len(r.src_pages)} pages x "
        f"{r.fragments[0].rows_per_page} rows = {n:,} descriptors "
        f"({n // hnd}x the {hnd:,} of head-major pages: the price of token-major rows)",
        "",
        "| way | time | descriptors / s | pdplan is faster by | target |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| Python loop (list of tuples) | {fmt_time(t_loop)} | {n / t_loop:,.0f} | "
        f"{t_loop / t_ours:,.0f}× | — |",
        f"| numpy, one expression per fragment (no checks) | {fmt_time(t_numpy)} | "
        f"{n / t_numpy:,.0f} | {t_numpy / t_ours:,.1f}× | ≥ 2× |",
        f"| pdplan `transfer_descriptors(coalesce=False)`, with limits | {fmt_time(t_ours)} | "
        f"{n / t_ours:,.0f} | — | ≥ 300,000,000 / s |",
        f"| pdplan `transfer_descriptors()` (coalesced: {merged.num_descriptors:,} left) | "
        f"{fmt_time(t_merged)} | {n / t_merged:,.0f} | — | — |",
    ]
    text = "\n".join(lines)
    print(text)
    return text


PEAK_SCRIPT = """
import gc, json, resource, sys
import numpy  # loaded up front so its own footprint is not counted
sys.path.insert(0, {benches!r})
from scenarios import cluster
import pdplan

def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024

def vm_hwm_kib():
    # VmHWM, unlike ru_maxrss, is not inherited from the parent across fork.
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))

s = cluster(4096, 16, 4096, 4)
gc.collect()
before = rss_kib()
planner = pdplan.PDTransferPlanner(prefill_layout=s.prefill, decode_layout=s.decode,
    prefill_buffers=s.prefill_buffers, decode_buffers=s.decode_buffers)
built = rss_kib()
plan = planner.plan_for_decode_rank(s.decode.world_size - 1)
fanout = planner.source_fanout
table = planner.routing_table()
everything = rss_kib()
print(json.dumps({{"prefill_ranks": s.prefill.world_size, "decode_ranks": s.decode.world_size,
                  "buffers": len(s.prefill_buffers), "build_kib": built - before,
                  "all_kib": everything - before,
                  "peak_rss_kib": vm_hwm_kib()}}))
"""


def peak_memory() -> dict[str, Any]:
    """Resident memory of a 65,536-prefill-rank planner, measured in a fresh process."""
    script = PEAK_SCRIPT.format(benches=str(Path(__file__).parent))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def scaling(repeat: int) -> list[dict[str, Any]]:
    points = []
    for world in [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]:
        tp = min(world, 16)
        s = cluster(world // tp, tp, world // tp, max(1, tp // 4))
        ranks = range(s.decode.world_size)

        def walk(s: Scenario = s, ranks: range = ranks) -> None:
            planner = pure_python.WalkingPlanner(*s.args)
            [planner.plan_for_decode_rank(r) for r in ranks]

        def ours(s: Scenario = s, ranks: range = ranks) -> None:
            planner = s.planner()
            [planner.plan_for_decode_rank(r) for r in ranks]

        t_walk, _ = best_of(walk, 1 if world >= 1024 else repeat)
        t_ours, _ = best_of(ours, repeat)
        points.append({"prefill_world": world, "pure_python": t_walk, "pdplan": t_ours})
        print(f"  world {world:5d}: pure Python {fmt_time(t_walk)}, pdplan {fmt_time(t_ours)}")
    return points


def plot(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = [p["prefill_world"] for p in points]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(worlds, [p["pure_python"] for p in points], "o-", label="pure Python (walk)")
    ax.loglog(worlds, [p["pdplan"] for p in points], "s-", label="pdplan")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prefill world size (ranks); decode world = prefill / 4")
    ax.set_ylabel("seconds: construct + plan every decode rank")
    ax.set_title("Planning a whole cluster (80 layers of K and V, 8 KV heads)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--reference",
        type=Path,
        metavar="transfer_plan.py",
        help="also time the reference planner itself (not shipped)",
    )
    parser.add_argument("--callgrind", action="store_true", help="add instruction counts")
    parser.add_argument(
        "--save-counts", type=Path, metavar="FILE.json", help="write the counts (with --callgrind)"
    )
    parser.add_argument(
        "--counts-before",
        type=Path,
        metavar="FILE.json",
        help="a build's counts (--save-counts) to set beside these",
    )
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    print("## prefill 4096 ranks (256 x TP 16) -> decode 1024 ranks (256 x TP 4), 160 buffers\n")
    table = print_table(large_world_table(args.repeat))
    memory = peak_memory()
    summary = (
        f"memory, {memory['prefill_ranks']}-rank prefill / {memory['decode_ranks']}-rank decode "
        f"planner, {memory['buffers']} buffers: resident growth {memory['build_kib']} KiB to "
        f"build; {memory['all_kib']} KiB with one plan, the {memory['prefill_ranks']}-entry "
        f"source_fanout dict and the routing table; whole-process peak RSS "
        f"{memory['peak_rss_kib'] / 1024:.0f} MiB"
    )
    print("\n" + summary)
    table += "\n\n" + summary
    if args.reference:
        print("\n## the same world against the reference planner itself\n")
        table += "\n\n" + reference_table(args.reference, args.repeat)
    print("\n## pdplan against the floors (this machine, this run)\n")
    table += "\n\n" + floors_table()
    if args.callgrind:
        print()
        counts = instruction_counts()
        if args.save_counts:
            saved = {"provenance": provenance.fields(), "counts": counts}
            args.save_counts.write_text(json.dumps(saved, indent=1) + "\n")
        before = json.loads(args.counts_before.read_text()) if args.counts_before else None
        table += "\n\n" + counts_table(counts, before)
    provenance.write("large_world.md", table)
    print("\n## per-request descriptors: 70B model, 32k tokens, prefill TP 8 -> decode TP 2\n")
    provenance.write("descriptors.md", descriptor_table(args.repeat))
    print("\n## the same request with token-major (NHD) pages\n")
    provenance.write("descriptors_nhd.md", nhd_descriptor_table(args.repeat))
    if not args.no_plot:
        print("\nscaling:")
        points = scaling(max(1, args.repeat // 2))
        plot(points, provenance.ROOT / "docs" / "images" / "scaling.png")
        provenance.write_json("scaling.json", {"points": points})
        print("wrote docs/images/scaling.png")


if __name__ == "__main__":
    main()

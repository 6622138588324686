"""The per-request path, side by side in one run: a prefill rank receives a decode rank's frames
(new bytes each request) and builds that request's descriptors; the decode rank encodes the
fragment list it encoded last time.

    python benches/per_request.py [--reference path/to/transfer_plan.py] [--callgrind] [--nixl]

70B-like model (80 layers, 8 KV heads, head dim 128, bf16, 16-token pages), prefill TP 8 ->
decode TP 2, one prefill rank's 160 fragments; requests of 4, 64 and 2048 pages. Ways compared:

- baseline: the decoder (the reference's with --reference, else the pure-Python one in
  benches/pure_python.py) plus the runtime's per-page Python loop;
- pdplan two calls: decode_transfer_fragments + transfer_descriptors;
- pdplan prepared: PreparedTransfer.from_frames(...).descriptors(...).

Timings are best-of on a shared 2-core machine; --callgrind adds instruction counts per request
(valgrind, the stable measure), --nixl the cost of handing one request to NIXL in both forms.
Writes benches/results/per_request.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import pdplan
from pdplan import PreparedTransfer, decode_transfer_fragments, encode_transfer_fragments

import callgrind
import provenance
import pure_python
from scenarios import llama70b_request

RESULTS = provenance.RESULTS
PAGES = (4, 64, 2048)


def best(fn: Callable[[], Any], seconds: float = 0.4) -> float:
    """Best per-call time of several timed loops."""
    fn()
    n = 1
    while True:  # calls per loop so that a loop takes ~20 ms
        started = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - started > 0.02:
            break
        n *= 2
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        started = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - started) / n)
    return min(times)


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:,.2f} ms"


class Setup:
    def __init__(self, reference: Path | None) -> None:
        r = llama70b_request()
        self.fragments = r.fragments
        self.version, self.payload = encode_transfer_fragments(r.fragments)
        self.src_bases = np.array(r.src_bases, dtype=np.uint64)
        self.dst_bases = np.array(r.dst_bases, dtype=np.uint64)
        self.src_limits = np.array(r.src_limits, dtype=np.uint64)
        self.dst_limits = np.array(r.dst_limits, dtype=np.uint64)
        self.pages = {n: (r.src_pages[:n], r.dst_pages[:n]) for n in PAGES}
        self.reference = None
        if reference is not None:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
            from make_golden_vectors import load_reference

            self.reference = load_reference(reference)

    def baseline_decode(self, payload: bytes) -> Any:
        if self.reference is not None:
            return self.reference.decode_transfer_fragments(self.version, payload)
        return pure_python.decode(self.version, payload, pdplan.BufferKind)

    def baseline_encode(self) -> Any:
        if self.reference is not None:
            return self.reference.encode_transfer_fragments(self.fragments)
        return pure_python.encode(self.fragments)

    def baseline(self, n: int) -> Any:
        fragments = self.baseline_decode(bytes(self.payload))
        src, dst = self.pages[n]
        bases = (self.src_bases.tolist(), self.dst_bases.tolist())
        return pure_python.descriptors_loop(fragments, *bases, src, dst)

    def two_calls(self, n: int) -> Any:
        fragments = decode_transfer_fragments(self.version, bytes(self.payload))
        return pdplan.transfer_descriptors(
            fragments,
            self.src_bases,
            self.dst_bases,
            *self.pages[n],
            src_limits=self.src_limits,
            dst_limits=self.dst_limits,
        )

    def prepared(self, n: int, payload: bytes | None = None) -> Any:
        prepared = PreparedTransfer.from_frames(
            self.version,
            bytes(self.payload) if payload is None else payload,
            self.src_bases,
            self.dst_bases,
            src_limits=self.src_limits,
            dst_limits=self.dst_limits,
        )
        return prepared.descriptors(*self.pages[n])


def first_time_payloads(setup: Setup, count: int) -> list[bytes]:
    """Frames never seen before: the same list, each with another decode rank number."""
    return [
        setup.payload.replace(b'"dst_rank":1,', f'"dst_rank":{1000 + i},'.encode())
        for i in range(count)
    ]


CALLGRIND_SCRIPT = """
import sys
sys.path.insert(0, {benches!r})
import per_request
setup = per_request.Setup({reference!r})
way, pages, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
call = {{
    "baseline": lambda: setup.baseline(pages),
    "two_calls": lambda: setup.two_calls(pages),
    "prepared": lambda: setup.prepared(pages),
    "encode_known": lambda: pdplan_encode(setup.fragments),
    "encode_baseline": setup.baseline_encode,
}}[way]
from pdplan import encode_transfer_fragments as pdplan_encode
call()
for _ in range(count):
    call()
"""


def instructions(way: str, pages: int, count: int, reference: Path | None) -> float:
    """Instructions per call of one way under callgrind."""
    script = CALLGRIND_SCRIPT.format(
        benches=str(Path(__file__).resolve().parent),
        reference=str(reference) if reference else None,
    )
    return callgrind.instructions(script, [way, str(pages)], count)


#: The parts of a prepared request from frames, by the functions that do them (callgrind's
#: inclusive counts); what no part names is the Python calls themselves.
PARTS = (
    ("converting the arguments (4 buffer arrays, 2 page arrays)", ("convert::u64_column",)),
    ("hashing the payload (frames not among the last few used)", ("xxh3",)),
    ("comparing the payload and buffers with the cached entry", ("__memcmp",)),
    ("placing the fragments against the buffers (new frames or buffers)", ("from_valid",)),
    ("building the 640 descriptors", ("Prepared::descriptors",)),
    ("making the three numpy arrays and the result tuple", ("descriptors_object",)),
)


def where_time_goes(measured: float, reference: Path | None) -> list[str]:
    """The 4-page prepared request split into its parts: instructions per request from
    callgrind, and the measured time shared out in proportion (an estimate: instructions are
    not all equally fast)."""
    script = CALLGRIND_SCRIPT.format(
        benches=str(Path(__file__).resolve().parent),
        reference=str(reference) if reference else None,
    )
    calls = 500
    counts = callgrind.inclusive(script, ["prepared", "4"], calls)
    total = counts["PROGRAM TOTALS"]
    rows, named = [], 0.0
    for label, symbols in PARTS:
        part = sum(v for name, v in counts.items() if any(s in name for s in symbols))
        named += part
        rows.append((label, part))
    rows.append(("Python: two method calls, their arguments, the loop around them", total - named))
    lines = [
        f"Where a 4-page request's {fmt(measured)} goes (callgrind instructions per request, "
        "the measured time shared out in proportion):",
        "",
        "| part | instructions | share | ≈ time |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {label} | {part:,.0f} | {part / total:.0%} | {fmt(measured * part / total)} |"
        for label, part in rows
    ]
    lines.append(f"| all | {total:,.0f} | 100% | {fmt(measured)} |")
    return lines


def nixl_handoff(setup: Setup, n: int) -> tuple[float, float]:
    """Per request, building the request and handing it to NIXL (the transfer handle, not the
    copy): descriptor arrays (get_xfer_descs x 2 + initialize_xfer) against indices into
    lists prepared once (make_prepped_xfer)."""
    from nixl_cu12._api import nixl_agent, nixl_agent_config

    capacity = 8192
    src_mem = np.zeros(1 << 20, dtype=np.uint8)  # only registered ranges matter for handles
    local = nixl_agent("bench-local", nixl_agent_config(backends=["UCX"]))
    remote = nixl_agent("bench-remote", nixl_agent_config(backends=["UCX"]))
    for agent, bases, limits in (
        (local, setup.src_bases, setup.src_limits),
        (remote, setup.dst_bases, setup.dst_limits),
    ):
        agent.register_memory(
            np.column_stack((bases, limits, np.zeros_like(bases))).astype(np.uint64), "DRAM"
        )
    del src_mem
    name = local.add_remote_agent(remote.get_agent_metadata())
    prepared = PreparedTransfer.from_frames(
        setup.version,
        setup.payload,
        setup.src_bases,
        setup.dst_bases,
        src_limits=setup.src_limits,
        dst_limits=setup.dst_limits,
    )
    lists = prepared.nixl_prepped_lists(capacity, capacity)
    local_side = local.prep_xfer_dlist("NIXL_INIT_AGENT", lists[0], "DRAM")
    remote_side = local.prep_xfer_dlist(name, lists[1], "DRAM")
    pages = setup.pages[n]

    def address_form() -> None:
        d = prepared.descriptors(*pages)
        zeros = np.zeros_like(d.lengths)
        handle = local.initialize_xfer(
            "WRITE",
            local.get_xfer_descs(np.column_stack((d.src_addrs, d.lengths, zeros)), "DRAM"),
            local.get_xfer_descs(np.column_stack((d.dst_addrs, d.lengths, zeros)), "DRAM"),
            name,
        )
        local.release_xfer_handle(handle)

    def prepped_form() -> None:
        li, ri = prepared.nixl_prepped_indices(*pages, capacity, capacity)
        handle = local.make_prepped_xfer("WRITE", local_side, li, remote_side, ri)
        local.release_xfer_handle(handle)

    timings = best(address_form), best(prepped_form)
    local.release_dlist_handle(local_side)
    local.release_dlist_handle(remote_side)
    local.remove_remote_agent(name)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, metavar="transfer_plan.py")
    parser.add_argument("--callgrind", action="store_true", help="add instruction counts")
    parser.add_argument("--nixl", action="store_true", help="add NIXL's two request forms")
    args = parser.parse_args()
    setup = Setup(args.reference)
    base_name = "reference decode" if args.reference else "pure-Python decode"
    # Agreement first: every way builds the same descriptors.
    for n in PAGES:
        expected = setup.baseline(n)
        for way in (setup.two_calls, setup.prepared):
            got = way(n).as_array().tolist()
            assert [tuple(r) for r in got] == expected, (way.__name__, n)
    lines = [
        f"70B-like, prefill TP 8 -> decode TP 2, {len(setup.fragments)} fragments from one "
        f"prefill rank; frames in (fresh bytes), descriptors out. Baseline: {base_name} + "
        "per-page Python loop.",
        "",
        "| pages (descriptors) | baseline | pdplan two calls | pdplan prepared | prepared vs "
        "baseline | target | budget 8 µs + 3 ns/descriptor |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    prepared_times = {}
    for n in PAGES:
        count = n * len(setup.fragments)
        t_base = best(lambda n=n: setup.baseline(n), 1.0)
        t_two = best(lambda n=n: setup.two_calls(n))
        t_prep = best(lambda n=n: setup.prepared(n))
        prepared_times[n] = t_prep
        target = {4: "≥ 80×", 64: "≥ 150×"}.get(n, "—")
        budget = 8e-6 + 3e-9 * count
        lines.append(
            f"| {n} ({count:,}) | {fmt(t_base)} | {fmt(t_two)} | {fmt(t_prep)} | "
            f"{t_base / t_prep:,.0f}× | {target} | {fmt(budget)} |"
        )
    t_enc_base = best(setup.baseline_encode)
    t_enc = best(lambda: encode_transfer_fragments(setup.fragments))
    fresh = first_time_payloads(setup, 4000)
    it = iter(fresh)
    t_first = best(lambda: setup.prepared(4, next(it)), 0.2)
    lines += [
        "",
        "| other per-request costs | baseline | pdplan | ratio | target |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| encode a known list (decode side) | {fmt(t_enc_base)} | {fmt(t_enc)} | "
        f"{t_enc_base / t_enc:,.0f}× | ≥ 200× |",
        f"| first time: from_frames on new frames + 4 pages | — | {fmt(t_first)} | — | — |",
    ]
    if args.callgrind:
        lines += [
            "",
            "Instructions per request (valgrind --tool=callgrind, the stable measure):",
            "",
            "| way | 4 pages | 64 pages | 2048 pages |",
            "| --- | ---: | ---: | ---: |",
        ]
        # Fewer calls where one call is long: valgrind runs ~50x slower.
        calls = {"baseline": {4: 20, 64: 5, 2048: 1}}
        for way in ("baseline", "two_calls", "prepared"):
            counts = [
                instructions(
                    way, n, calls.get(way, {}).get(n, 200 if n < 2048 else 10), args.reference
                )
                for n in PAGES
            ]
            lines.append(f"| {way} | " + " | ".join(f"{c:,.0f}" for c in counts) + " |")
        for way in ("encode_baseline", "encode_known"):
            lines.append(f"| {way} | {instructions(way, 4, 200, args.reference):,.0f} | | |")
        lines += ["", *where_time_goes(prepared_times[4], args.reference)]
    if args.nixl:
        lines += [
            "",
            "Handing one request to NIXL (building it and creating the transfer handle):",
            "",
            "| pages | descriptor arrays (get_xfer_descs + initialize_xfer) | prepped lists "
            "(indices + make_prepped_xfer) |",
            "| --- | ---: | ---: |",
        ]
        for n in PAGES:
            address, prepped = nixl_handoff(setup, n)
            lines.append(f"| {n} | {fmt(address)} | {fmt(prepped)} |")
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    provenance.write("per_request.md", text)
    if args.nixl:
        # nixl-cu12 1.5.1's agents crash in their destructors at interpreter exit (even with
        # every handle released); the results are written, so leave without running them.
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()

"""What NIXL itself reaches on this machine's loopback, with no connector: one agent reads
another process's registered memory (as a decode rank reads a prefill rank's cache), 128 MiB
in descriptors of 4 KiB to 16 MiB, through UCX with each shared-memory transport it offers on
loopback, beside numpy's memcpy of the same bytes (one thread). The limit any connector's reads
through NIXL meet here (benches/vllm_bandwidth.py); the figure is the time from posting the
read to NIXL reporting it done.

    python benches/nixl_loopback.py   # writes benches/results/nixl_loopback.md
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from typing import Any

import numpy as np

from provenance import write

TOTAL = 128 << 20
SIZES = (4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20)
ROUNDS = 5
#: UCX's transports on loopback (``UCX_TLS``): let it choose; shared memory without
#: cross-memory attach (copies through a shared segment, no kernel copy by
#: ``process_vm_readv``); TCP. And NIXL's UCX backend threads
#: (``nixl_agent_config(num_threads=...)``: 0 is NIXL's default and pdplan's; NixlConnector asks
#: for 4). Each row's transport and threads.
ROWS = (("default", 0), ("^cma", 0), ("tcp", 0), ("default", 2), ("default", 4))


def _api() -> Any:
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError:
        from nixl_cu12._api import nixl_agent, nixl_agent_config
    return nixl_agent, nixl_agent_config


def _holder(pipe: Any, transport: str, threads: int) -> None:
    """The other process: registers ``TOTAL`` bytes and serves them until told to stop."""
    _environment(transport)
    nixl_agent, config = _api()
    agent = nixl_agent("loopback-holder", config(backends=["UCX"], num_threads=threads))
    memory = np.full(TOTAL, 7, np.uint8)
    agent.register_memory(np.array([[memory.ctypes.data, TOTAL, 0]], np.uint64), "DRAM")
    pipe.send((agent.get_agent_metadata(), memory.ctypes.data))
    pipe.recv()
    os._exit(0)  # NIXL's agents may crash the interpreter at exit


def _environment(transport: str) -> None:
    if not (os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband")):
        os.environ["UCX_MODULES"] = "^ib"
    if transport != "default":
        os.environ["UCX_TLS"] = transport


def measure(transport: str, threads: int) -> dict[int, float]:
    """GB/s of a 128 MiB read in descriptors of each size (median of the rounds)."""
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe()
    holder = context.Process(target=_holder, args=(theirs, transport, threads))
    holder.start()
    try:
        if not mine.poll(120):  # the holder could not make its agent
            raise RuntimeError(f"UCX_TLS={transport}, {threads} threads: no agent")
        metadata, remote_base = mine.recv()
        _environment(transport)
        nixl_agent, config = _api()
        agent = nixl_agent(f"loopback-reader-{transport}-{threads}",
                           config(backends=["UCX"], num_threads=threads))  # fmt: skip
        target = np.zeros(TOTAL, np.uint8)
        agent.register_memory(np.array([[target.ctypes.data, TOTAL, 0]], np.uint64), "DRAM")
        peer = agent.add_remote_agent(metadata)
        peer = peer.decode() if isinstance(peer, bytes) else peer
        out = {}
        for size in SIZES:
            offsets = np.arange(0, TOTAL, size, dtype=np.uint64)
            lengths = np.full(len(offsets), size, np.uint64)
            zeros = np.zeros(len(offsets), np.uint64)
            local = agent.get_xfer_descs(np.column_stack((target.ctypes.data + offsets, lengths,
                                                          zeros)), "DRAM")  # fmt: skip
            remote = agent.get_xfer_descs(np.column_stack((remote_base + offsets, lengths,
                                                           zeros)), "DRAM")  # fmt: skip
            times = []
            for _ in range(ROUNDS):
                target[:] = 0
                start = time.perf_counter()
                handle = agent.initialize_xfer("READ", local, remote, peer)
                state = agent.transfer(handle)
                while state not in ("DONE", "ERR"):
                    state = agent.check_xfer_state(handle)
                times.append(time.perf_counter() - start)
                agent.release_xfer_handle(handle)
                if state != "DONE" or target[-1] != 7 or target[0] != 7:
                    raise RuntimeError(f"{transport}: the read of {size}-byte descriptors failed")
            out[size] = TOTAL / statistics.median(times) / 1e9
        return out
    finally:
        try:
            mine.send("stop")
        except OSError:  # the holder is gone
            pass
        holder.join(timeout=30)
        if holder.is_alive():
            holder.kill()


def memcpy_gbps() -> float:
    """numpy's copy of ``TOTAL`` bytes in one thread, the best of the rounds (the limit, as
    benches/vllm_bandwidth.py takes it)."""
    source = np.ones(TOTAL, np.uint8)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return TOTAL / best / 1e9


def main() -> None:
    memcpy = memcpy_gbps()
    rows = []
    for transport, threads in ROWS:
        try:
            found = measure(transport, threads)
        except Exception as error:  # a transport UCX does not offer here
            rows.append(f"| {transport} | {threads} | fails: {str(error).splitlines()[0]} |"
                        + " |" * (len(SIZES) - 1))  # fmt: skip
            continue
        cells = " | ".join(f"{g:.2f} ({g / memcpy:.2f})" for g in found.values())
        rows.append(f"| {transport} | {threads} | {cells} |")
        print(rows[-1], flush=True)
    header = " | ".join(f"{s >> 10} KiB" for s in SIZES)
    write("nixl_loopback.md", "\n".join([
        f"NIXL (UCX) reading {TOTAL >> 20} MiB of another process's registered memory in "
        "descriptors of each size, from posting the read to NIXL reporting it done, median of "
        f"{ROUNDS} rounds; GB/s, and in brackets against numpy's memcpy of the same bytes in "
        f"one thread (the best of {ROUNDS}: {memcpy:.2f} GB/s). Transport: UCX's choice, or one "
        "forced with "
        "`UCX_TLS` (`^cma`: shared memory without the kernel's `process_vm_readv` copy; tcp); NIXL "
        "UCX threads: `nixl_agent_config(num_threads=...)` on both agents (0: NIXL's default, "
        "pdplan's; NixlConnector asks for 4).",
        "",
        f"| UCX transport | NIXL UCX threads | {header} |",
        "| --- | --- |" + " --- |" * len(SIZES),
        *rows,
    ]))  # fmt: skip
    os._exit(0)  # NIXL's agents may crash the interpreter at exit; the results are out


if __name__ == "__main__":
    main()

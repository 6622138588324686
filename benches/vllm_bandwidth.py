"""Long prompts through real vLLM pairs, PdplanConnector beside NixlConnector: how fast each
moves a KV-heavy model's cache, and a new pair's first request. A tiny fp32 Llama with 64 KiB
of KV a token (8 layers, 8 KV heads of 128 dims), prompts of 2,048 to 4,000 tokens, one request
a round, at prefill TP -> decode TP 1 -> 1, 1 -> 2 and 2 -> 1; NixlConnector, PdplanConnector
through NIXL and PdplanConnector through Mooncake (all on loopback). Per round, the decode side's
time to first token split into its parts by the same hooks wrapped on every connector
(tests/vllm_engine/timing.py): waiting (from sending the decode request to the step that hands
it to the connector: the scheduler, and a first request's handshake where the connector does
it there), posting (that step's ``start_load_kv``), the transfer (from then to the step that
reports it received: the engine's transfer and the polls), and the last token (from then to the
first token: the decode side computes the last prompt token). The transfer's GB/s is the KV
bytes of the request's blocks over its posting and transfer (an engine may copy inside the
posting call: UCX on loopback does), beside this machine's memcpy of the same bytes (numpy,
one thread: the limit). Each pair's first round is its first request (handshakes,
registration, plan), reported apart. Needs vLLM (scripts/install_vllm.sh).

    python benches/vllm_bandwidth.py   # writes benches/results/vllm_bandwidth.md
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/vllm_engine"))
sys.path.insert(0, str(ROOT / "benches"))

import timing  # noqa: E402
from harness import (  # noqa: E402
    Instance,
    decode_params,
    llm_args,
    pdplan_connector,
    prefill_params,
    write_model,
)

from provenance import write  # noqa: E402

#: Rounds after a pair's first request (fewer for a quick look: PDPLAN_VLLM_ROUNDS=2).
ROUNDS = int(os.environ.get("PDPLAN_VLLM_ROUNDS", "6"))
#: Prompt tokens, a round each in turn.
LENGTHS = (2048, 3072, 4000)
LAYERS, KV_HEADS, HEAD_DIM = 8, 8, 128
#: Bytes of KV a token: K and V of every layer's heads, fp32.
TOKEN_BYTES = LAYERS * 2 * KV_HEADS * HEAD_DIM * 4
BLOCK = 32
PAIRS = ((1, 1), (1, 2), (2, 1))
CONNECTORS = ("nixl", "pdplan", "pdplan-mooncake")
NAMES = {"nixl": "NixlConnector", "pdplan": "PdplanConnector (NIXL)",
         "pdplan-mooncake": "PdplanConnector (Mooncake)"}  # fmt: skip


def connector(kind: str, role: str, port: int) -> dict[str, Any]:
    if kind == "nixl":
        return {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}
    return pdplan_connector(role, port, "mooncake" if kind == "pdplan-mooncake" else "nixl")


def args(model: Path, tp: int, config: dict[str, Any]) -> dict[str, Any]:
    out = llm_args(model, tp=tp, connector=config)
    out.update(max_model_len=4096, max_num_batched_tokens=4096, kv_cache_memory_bytes=1 << 30)
    return out


def prompt(length: int, salt: int) -> list[int]:
    draw = np.random.default_rng(salt)
    return [int(t) for t in draw.integers(1, 500, length)]


def block_bytes(tokens: int) -> int:
    """The KV bytes of a request's blocks, every decode rank's share together."""
    return -(-tokens // BLOCK) * BLOCK * TOKEN_BYTES


class Pair:
    """One connector's prefill and decode instances, started for this pair."""

    def __init__(self, model: Path, logs: Path, kind: str, prefill_tp: int, decode_tp: int,
                 port: int) -> None:  # fmt: skip
        self.name = f"{kind}-{prefill_tp}-{decode_tp}"
        env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)}
        self.prefill = Instance(args(model, prefill_tp, connector(kind, "kv_producer", port)),
                                logs / f"{self.name}-p.log", env)  # fmt: skip
        self.times_file = str(logs / f"{self.name}-transfers.txt")
        timing.read_marks(self.times_file)  # an earlier run's lines
        decode_env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(port + 10), timing.ENV: self.times_file}
        self.decode = Instance(args(model, decode_tp, connector(kind, "kv_consumer", port + 10)),
                               logs / f"{self.name}-d.log", decode_env)  # fmt: skip

    def round(self, length: int, salt: int) -> dict[str, float]:
        """One request: prefilled, then read and decoded to its first token, timed."""
        prompts = [prompt(length, salt)]
        started = time.perf_counter()
        prefilled = self.prefill.generate(prompts, prefill_params(1))
        sent = time.perf_counter()
        self.decode.generate(prompts, decode_params(prefilled, 1))
        done = time.perf_counter()
        marks, posted = timing.read_marks(self.times_file)
        if len(marks) != 1:  # computed on the decode side instead: no figure
            raise RuntimeError(f"{self.name}: the request was not read:\n{self.decode.tail()}")
        [(_, entered, left, received)] = marks.values()
        moved = block_bytes(length - 1)  # the decode side computes the last prompt token
        return {
            "first_token": done - started, "ttft": done - sent, "waiting": entered - sent,
            "posting": left - entered, "transfer": received - left, "last": done - received,
            "gbps": moved / (received - entered) / 1e9, "bytes": moved, "posted": posted,
        }  # fmt: skip

    def close(self) -> None:
        self.decode.close()
        self.prefill.close()


def memcpy_gbps(size: int) -> float:
    """This machine's copy of ``size`` bytes, one thread, best of five."""
    source = np.ones(size, np.uint8)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return size / best / 1e9


def measure(model: Path, logs: Path, kind: str, prefill_tp: int, decode_tp: int,
            port: int) -> dict[str, Any] | str:  # fmt: skip
    """A fresh pair's first request, then ``ROUNDS`` more; or why the pair does not run."""
    pair = None
    try:
        pair = Pair(model, logs, kind, prefill_tp, decode_tp, port)
        first = pair.round(LENGTHS[0], 0)
        rounds = [pair.round(LENGTHS[i % len(LENGTHS)], i + 1) for i in range(ROUNDS)]
    except Exception as error:  # a pair a connector does not serve
        print(f"{kind} {prefill_tp} -> {decode_tp}: {error}", flush=True)
        return str(error).splitlines()[0]
    finally:
        if pair is not None:
            pair.close()
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print(pair.name, {k: round(v, 4) for k, v in medians.items()}, flush=True)
    return {"first": first, "medians": medians}


def main() -> None:
    work = Path("/tmp/pdplan-vllm-bandwidth")
    work.mkdir(exist_ok=True)
    model = work / "kv-heavy-llama"
    if not (model / "config.json").exists():
        write_model(model, layers=LAYERS, heads=KV_HEADS, kv_heads=KV_HEADS,
                    head_dim=HEAD_DIM, positions=4096)  # fmt: skip
    only = os.environ.get("PDPLAN_VLLM_CONNECTORS")
    kinds = tuple(k for k in CONNECTORS if not only or k in only.split(","))
    results: dict[tuple[int, int], dict[str, Any]] = {}
    port = 6600
    for index, (prefill_tp, decode_tp) in enumerate(PAIRS):
        order = kinds if index % 2 == 0 else kinds[::-1]  # which goes first alternates
        for kind in order:
            port += 40
            results.setdefault((prefill_tp, decode_tp), {})[kind] = measure(
                model, work, kind, prefill_tp, decode_tp, port
            )
    sizes = [block_bytes(n - 1) for n in LENGTHS]
    memcpy = statistics.median(memcpy_gbps(s) for s in sizes)
    write("vllm_bandwidth.md", report(results, kinds, memcpy))


def report(results: dict[tuple[int, int], dict[str, Any]], kinds: tuple[str, ...],
           memcpy: float) -> str:  # fmt: skip
    ms = 1e3
    long_rows, first_rows = [], []
    for (prefill_tp, decode_tp), by_kind in results.items():
        nixl = by_kind.get("nixl")
        for kind in kinds:
            found = by_kind[kind]
            pair = f"{prefill_tp} -> {decode_tp}"
            if not isinstance(found, dict):
                long_rows.append(f"| {pair} | {NAMES[kind]} | fails: {found} |" + " |" * 9)
                first_rows.append(f"| {pair} | {NAMES[kind]} | fails: {found} |" + " |" * 7)
                continue
            m = found["medians"]
            ratio = (m["ttft"] / nixl["medians"]["ttft"]) if isinstance(nixl, dict) else None
            long_rows.append(
                f"| {pair} | {NAMES[kind]} | {m['ttft'] * ms:.0f} | "
                f"{'—' if ratio is None else f'{ratio:.2f}'} | {m['waiting'] * ms:.0f} | "
                f"{m['posting'] * ms:.1f} | {m['transfer'] * ms:.0f} | {m['last'] * ms:.0f} | "
                f"{m['bytes'] / 2**20:.0f} | {m['posted']:.0f} | {m['gbps']:.2f} | "
                f"{m['gbps'] / memcpy:.2f} |"
            )
            first = found["first"]
            base = nixl["first"] if isinstance(nixl, dict) else None
            whole = "—" if base is None else f"{first['first_token'] / base['first_token']:.2f}"
            decode = "—" if base is None else f"{first['ttft'] / base['ttft']:.2f}"
            first_rows.append(
                f"| {pair} | {NAMES[kind]} | {first['first_token']:.2f} | {whole} | "
                f"{first['ttft'] * ms:.0f} | {decode} | {first['waiting'] * ms:.0f} | "
                f"{first['posting'] * ms:.0f} | {first['transfer'] * ms:.0f} | "
                f"{first['last'] * ms:.0f} |"
            )
    return "\n".join([
        f"A tiny fp32 Llama with {TOKEN_BYTES // 1024} KiB of KV a token ({LAYERS} layers, "
        f"{KV_HEADS} KV heads of {HEAD_DIM} dims), vLLM 0.32 CPU backend, block {BLOCK}, one "
        f"request a round of {', '.join(f'{n:,}' for n in LENGTHS)} tokens in turn, median of "
        f"{ROUNDS} rounds after the pair's first request; one connector's instances up at a "
        "time, a fresh pair each, which connector goes first alternating from pair to pair. "
        "NIXL 1.5.1 (UCX) and Mooncake (TCP), both on loopback. TTFT: the decode side's, from "
        "sending the decode request to its first token; split into waiting (to the step that "
        "hands the request to the connector), posting (that step's `start_load_kv`), the "
        "transfer (from then to the step that reports it received) and the last token (from "
        "then to the first token). KV moved: the bytes of the request's blocks, every decode "
        "rank's share; posted: the descriptors or strided entries handed to the transfer "
        "engine for it. GB/s: KV moved over posting and transfer together (UCX on loopback "
        "copies inside the posting call); against memcpy: over "
        f"this machine's copy of the same bytes ({memcpy:.2f} GB/s, numpy, one thread).",
        "",
        "| prefill TP -> decode TP | connector | TTFT (ms) | vs NixlConnector | waiting (ms) | "
        "posting (ms) | transfer (ms) | last token (ms) | KV moved (MiB) | posted | GB/s | "
        "of memcpy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *long_rows,
        "",
        f"A new pair's first request ({LENGTHS[0]:,} tokens): from sending it to the prefill "
        "instance to its first decoded token (the prefill, handshakes, registration, plan and "
        "read), and the decode side's part of it, split as above (a handshake lands in the "
        "part where the connector does it).",
        "",
        "| prefill TP -> decode TP | connector | first request to first token (s) | vs "
        "NixlConnector | decode side (ms) | vs NixlConnector | waiting (ms) | posting (ms) | "
        "transfer (ms) | last token (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *first_rows,
    ])  # fmt: skip


if __name__ == "__main__":
    main()

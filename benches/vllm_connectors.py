"""PdplanConnector beside vLLM's own NixlConnector, same harness, same prompts: real vLLM
instances on this CPU (tests/vllm_engine/harness.py), a prefill and a decode process per pair
and connector. The figure is the decode side's time to first token for a batch of requests
whose KV the prefill side holds (the pull, then one decode step), median of the rounds; both
connectors move through NIXL (UCX, loopback). Beside it, each request's transfer time inside
the decode workers (tests/vllm_engine/timing.py: the same two vLLM hooks wrapped on both
connectors). Pairs run on a model with two KV heads, and on one with one KV head, where a decode
TP above the heads makes every decode rank read its own replica. Needs vLLM
(scripts/install_vllm.sh).

    python benches/vllm_connectors.py   # writes benches/results/vllm_connectors.md
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/vllm_engine"))
sys.path.insert(0, str(ROOT / "benches"))

import timing  # noqa: E402
from harness import (  # noqa: E402
    LENGTHS,
    Instance,
    decode_params,
    llm_args,
    pdplan_connector,
    prefill_params,
    prompts_of,
    write_model,
)

from provenance import write  # noqa: E402

#: Rounds a pair (fewer for a quick look: PDPLAN_VLLM_ROUNDS=2).
ROUNDS = int(os.environ.get("PDPLAN_VLLM_ROUNDS", "40"))
#: (KV heads, prefill TP, decode TP).
PAIRS = ((2, 1, 1), (2, 1, 2), (2, 2, 1), (2, 2, 2), (1, 1, 2), (1, 2, 2))


def nixl_connector(role: str) -> dict[str, Any]:
    return {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}


def measure(model: Path, logs: Path, connector: str, prefill_tp: int, decode_tp: int,
            port: int) -> tuple[list[float], list[float]]:  # fmt: skip
    """Decode times to first token, and every request's transfer time, after a warm-up."""

    def config(role: str, side_port: int) -> dict[str, Any]:
        if connector == "pdplan":
            return pdplan_connector(role, side_port)
        return nixl_connector(role)

    env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)}
    name = f"{connector}-{prefill_tp}-{decode_tp}"
    prefill = Instance(llm_args(model, tp=prefill_tp, connector=config("kv_producer", port)),
                       logs / f"{name}-p.log", env)  # fmt: skip
    times_file = str(logs / f"{name}-transfers.txt")
    decode_env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(port + 10), timing.ENV: times_file}
    decode = Instance(llm_args(model, tp=decode_tp, connector=config("kv_consumer", port + 10)),
                      logs / f"{name}-d.log", decode_env)  # fmt: skip
    times, transfers = [], []
    try:
        for round_ in range(ROUNDS + 1):  # the first round warms up (handshakes)
            prompts = prompts_of(LENGTHS, salt=round_)
            prefilled = prefill.generate(prompts, prefill_params(len(prompts)))
            start = time.perf_counter()
            decode.generate(prompts, decode_params(prefilled, 1))
            elapsed = time.perf_counter() - start
            moved = timing.read(times_file)
            # A request computed on the decode side instead would be timed too short: every
            # request must have been received through the connector.
            if len(moved) != len(prompts):
                raise RuntimeError(f"{name}: {len(moved)} of {len(prompts)} requests were "
                                   f"received through the connector:\n{decode.tail()}")  # fmt: skip
            if round_:
                times.append(elapsed)
                transfers.extend(moved)
    finally:
        decode.close()
        prefill.close()
    print(name, "ms:", " ".join(f"{t * 1e3:.1f}" for t in times), flush=True)
    return times, transfers


def cells(medians: dict[str, float]) -> list[str]:
    """NixlConnector's, pdplan's and their ratio, or "fails" for a connector that did not run."""
    shown = [f"{medians[c]:.1f}" if c in medians else "fails" for c in ("nixl", "pdplan")]
    ratio = medians["pdplan"] / medians["nixl"] if len(medians) == 2 else None
    return [*shown, f"{ratio:.2f}" if ratio is not None else "—"]


def main() -> None:
    work = Path("/tmp/pdplan-vllm-bench")
    work.mkdir(exist_ok=True)
    models = {}
    for heads in (2, 1):
        models[heads] = work / f"tiny-llama-{heads}kv"
        if not (models[heads] / "config.json").exists():
            write_model(models[heads], kv_heads=heads)
    rows = []
    port = 6100
    only = os.environ.get("PDPLAN_VLLM_PAIRS")  # e.g. "1:1:2" for one pair
    for heads, prefill_tp, decode_tp in PAIRS:
        if only and f"{heads}:{prefill_tp}:{decode_tp}" not in only.split(","):
            continue
        ttft, moved = {}, {}
        for connector in ("nixl", "pdplan"):
            port += 20
            try:
                times, transfers = measure(models[heads], work, connector, prefill_tp,
                                           decode_tp, port)  # fmt: skip
            except Exception as error:  # a pair a connector does not serve
                print(f"{connector} {heads} KV heads {prefill_tp} -> {decode_tp}: {error}")
                continue
            ttft[connector] = statistics.median(times) * 1e3
            moved[connector] = statistics.median(transfers) * 1e3
        rows.append(" | ".join([
            f"| {heads} | {prefill_tp} -> {decode_tp}",
            *cells(ttft), *cells(moved),
        ]) + " |")  # fmt: skip
        print(rows[-1], flush=True)
    table = "\n".join([
        f"Decode time to first token for {len(LENGTHS)} requests of {', '.join(map(str, LENGTHS))} "
        f"tokens whose KV the prefill instance holds (the pull, then one decode step), median "
        f"of {ROUNDS} rounds after a warm-up; tiny fp32 Llama (2 layers, KV heads of 64), "
        "vLLM 0.32 CPU backend, block 32, both through NIXL 1.5.1 (UCX, loopback). Transfer: "
        "the median request's time from the step that hands it to the connector to the step "
        "that reports it received (its slowest decode rank). \"fails\": the connector does not "
        "serve the pair (the run's output says why).",
        "",
        "| KV heads | prefill TP -> decode TP | time to first token, NixlConnector (ms) | "
        "PdplanConnector (ms) | pdplan / NIXL | transfer, NixlConnector (ms) | "
        "PdplanConnector (ms) | pdplan / NIXL |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
    ])  # fmt: skip
    write("vllm_connectors.md", table)


if __name__ == "__main__":
    main()

"""PdplanConnector beside vLLM's own NixlConnector, same harness, same prompts: real vLLM
instances on this CPU (tests/vllm_engine/harness.py), a prefill and a decode process per pair
and connector. The figure is the decode side's time to first token for a batch of requests
whose KV the prefill side holds (the pull, then one decode step), median of the rounds; both
connectors move through NIXL (UCX, loopback). Needs vLLM (scripts/install_vllm.sh).

    python benches/vllm_connectors.py   # writes benches/results/vllm_connectors.md
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/vllm_engine"))
sys.path.insert(0, str(ROOT / "benches"))

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

ROUNDS = 20
PAIRS = ((1, 1), (1, 2), (2, 1), (2, 2))


def nixl_connector(role: str) -> dict[str, Any]:
    return {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}


def measure(model: Path, logs: Path, connector: str, prefill_tp: int, decode_tp: int,
            port: int) -> list[float]:  # fmt: skip
    def config(role: str, side_port: int) -> dict[str, Any]:
        if connector == "pdplan":
            return pdplan_connector(role, side_port)
        return nixl_connector(role)

    env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)}
    name = f"{connector}-{prefill_tp}-{decode_tp}"
    prefill = Instance(llm_args(model, tp=prefill_tp, connector=config("kv_producer", port)),
                       logs / f"{name}-p.log", env)  # fmt: skip
    decode_env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(port + 10)}
    decode = Instance(llm_args(model, tp=decode_tp, connector=config("kv_consumer", port + 10)),
                      logs / f"{name}-d.log", decode_env)  # fmt: skip
    times = []
    try:
        for round_ in range(ROUNDS + 1):  # the first round warms up (handshakes)
            prompts = prompts_of(LENGTHS, salt=round_)
            prefilled = prefill.generate(prompts, prefill_params(len(prompts)))
            start = time.perf_counter()
            decode.generate(prompts, decode_params(prefilled, 1))
            if round_:
                times.append(time.perf_counter() - start)
    finally:
        decode.close()
        prefill.close()
    return times


def main() -> None:
    work = Path("/tmp/pdplan-vllm-bench")
    work.mkdir(exist_ok=True)
    model = work / "tiny-llama"
    if not (model / "config.json").exists():
        write_model(model)
    rows = []
    port = 6100
    for prefill_tp, decode_tp in PAIRS:
        medians = {}
        for connector in ("nixl", "pdplan"):
            port += 20
            medians[connector] = statistics.median(
                measure(model, work, connector, prefill_tp, decode_tp, port)
            )
        ratio = medians["pdplan"] / medians["nixl"]
        rows.append(f"| {prefill_tp} -> {decode_tp} | {medians['nixl'] * 1e3:.1f} | "
                    f"{medians['pdplan'] * 1e3:.1f} | {ratio:.2f} |")  # fmt: skip
        print(rows[-1], flush=True)
    table = "\n".join([
        f"Decode time to first token for {len(LENGTHS)} requests of {', '.join(map(str, LENGTHS))} "
        f"tokens whose KV the prefill instance holds (the pull, then one decode step), median "
        f"of {ROUNDS} rounds after a warm-up; tiny fp32 Llama (2 layers, 2 KV heads of 64), "
        "vLLM 0.32 CPU backend, block 32, both through NIXL 1.5.1 (UCX, loopback).",
        "",
        "| prefill TP -> decode TP | NixlConnector (ms) | PdplanConnector (ms) | pdplan / NIXL |",
        "| --- | --- | --- | --- |",
        *rows,
    ])  # fmt: skip
    write("vllm_connectors.md", table)


if __name__ == "__main__":
    main()

"""Streamed against whole-request transfers in real vLLM instances on this CPU: one prefill
instance (64-token chunks of chunked prefill) and one decode instance with PdplanConnector
through NIXL (UCX, loopback), the same prompts both ways. The figure is the time from the end of
prefill (its ``generate`` returning) to the decode side's first token (its ``generate`` of one
token returning): whole, the decode request is sent then, as NixlConnector's proxy does, and the
whole KV moves; streamed, both requests went at once and the decode side read each chunk's
tokens as prefill made them final. Median of the rounds; long prompts run in up to six chunks.
Each prompt alone (a request's own time), and the prompts together: streamed, the batch's
earlier requests land before its last prefill chunk ends and start decoding, so the batch's
last first token waits behind their decode steps. Needs vLLM (scripts/install_vllm.sh).

    python benches/vllm_streaming.py   # writes benches/results/vllm_streaming.md
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/vllm_engine"))
sys.path.insert(0, str(ROOT / "benches"))

from harness import (  # noqa: E402
    LENGTHS,
    STREAMED_LENGTHS,
    Instance,
    decode_params,
    llm_args,
    pdplan_connector,
    prefill_params,
    prompts_of,
    streamed_params,
    write_model,
)

from provenance import write  # noqa: E402

ROUNDS = int(os.environ.get("PDPLAN_VLLM_ROUNDS", "10"))
PORT = 6600
CHUNK = 64


def whole(prefill: Instance, decode: Instance, prompts: list[list[int]]) -> float:
    done = prefill.generate(prompts, prefill_params(len(prompts)))
    ended = time.perf_counter()
    decode.generate(prompts, decode_params(done, 1))
    return time.perf_counter() - ended


def streamed(prefill: Instance, decode: Instance, prompts: list[list[int]], tag: str) -> float:
    first, then = streamed_params(prompts, PORT, 1, tag)
    ended: list[float] = []

    def run_prefill() -> None:
        prefill.generate(prompts, first)
        ended.append(time.perf_counter())

    thread = threading.Thread(target=run_prefill)
    thread.start()
    decode.generate(prompts, then)
    landed = time.perf_counter()
    thread.join()
    return landed - ended[0]


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        model = write_model(Path(folder) / "tiny-llama")
        logs = Path(folder)
        prefill_args = llm_args(model, connector=pdplan_connector("kv_producer", PORT))
        prefill_args["max_num_batched_tokens"] = CHUNK
        prefill = Instance(prefill_args, logs / "prefill.log")
        decode = Instance(
            llm_args(model, connector=pdplan_connector("kv_consumer", PORT + 10)),
            logs / "decode.log",
        )
        rows = []
        try:
            for name, lengths in (("short", LENGTHS), ("long", STREAMED_LENGTHS)):
                prompts = prompts_of(lengths, salt=21)
                whole(prefill, decode, prompts)  # warm both instances
                for batch in ("one request at a time", "all at once"):
                    times: dict[str, list[float]] = {"whole": [], "streamed": []}
                    for r in range(ROUNDS):
                        groups = [[p] for p in prompts] if batch.startswith("one") else [prompts]
                        for i, group in enumerate(groups):
                            times["whole"].append(whole(prefill, decode, group))
                            tag = f"{name}{batch[0]}{r}-{i}"
                            times["streamed"].append(streamed(prefill, decode, group, tag))
                    median = {k: statistics.median(v) for k, v in times.items()}
                    rows.append((name, lengths, batch, median))
        finally:
            prefill.close()
            decode.close()
    lines = [
        f"PdplanConnector through NIXL, a tiny Llama (2 layers, 2 KV heads of 64) on vLLM 0.32's "
        f"CPU backend, prefill in {CHUNK}-token chunks. Time from prefill's end to the decode "
        f"side's first token, median of {ROUNDS} rounds: each prompt sent alone, and the "
        "prompts sent together (one generate call each side).",
        "",
        "| prompts | tokens | sent | whole request after prefill | streamed while prefill runs | "
        "streamed / whole |",
        "|---|---|---|---:|---:|---:|",
    ]
    for name, lengths, batch, median in rows:
        lines.append(
            f"| {name} | {', '.join(map(str, lengths))} | {batch} | "
            f"{median['whole'] * 1e3:.1f} ms | {median['streamed'] * 1e3:.1f} ms | "
            f"{median['streamed'] / median['whole']:.2f} |"
        )
    text = "\n".join(lines)
    print(text)
    write("vllm_streaming.md", "# Streamed against whole requests in vLLM\n\n" + text)


if __name__ == "__main__":
    main()

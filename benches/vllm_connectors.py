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


class Pair:
    """One connector's prefill and decode instances."""

    def __init__(self, model: Path, logs: Path, connector: str, prefill_tp: int,
                 decode_tp: int, port: int) -> None:  # fmt: skip
        def config(role: str, side_port: int) -> dict[str, Any]:
            if connector == "pdplan":
                return pdplan_connector(role, side_port)
            if connector == "pdplan-spin":  # NIXL's own progress loop, as NixlConnector runs it
                return pdplan_connector(role, side_port, nixl_progress_delay_us=0)
            return nixl_connector(role)

        self.name = f"{connector}-{prefill_tp}-{decode_tp}"
        env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)}
        self.prefill = Instance(
            llm_args(model, tp=prefill_tp, connector=config("kv_producer", port)),
            logs / f"{self.name}-p.log", env,
        )  # fmt: skip
        self.times_file = str(logs / f"{self.name}-transfers.txt")
        decode_env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(port + 10), timing.ENV: self.times_file}
        self.decode = Instance(
            llm_args(model, tp=decode_tp, connector=config("kv_consumer", port + 10)),
            logs / f"{self.name}-d.log", decode_env,
        )  # fmt: skip
        self.times: list[float] = []
        self.transfers: list[float] = []

    def round(self, salt: int, kept: bool) -> None:
        """Prefills a batch, then times the decode side's first token; ``kept`` records it."""
        prompts = prompts_of(LENGTHS, salt=salt)
        prefilled = self.prefill.generate(prompts, prefill_params(len(prompts)))
        start = time.perf_counter()
        self.decode.generate(prompts, decode_params(prefilled, 1))
        elapsed = time.perf_counter() - start
        moved = timing.read(self.times_file)
        # A request computed on the decode side instead would be timed too short: every
        # request must have been received through the connector.
        if len(moved) != len(prompts):
            raise RuntimeError(
                f"{self.name}: {len(moved)} of {len(prompts)} requests were received through "
                f"the connector:\n{self.decode.tail()}"
            )
        if kept:
            self.times.append(elapsed)
            self.transfers.extend(moved)

    def close(self) -> None:
        self.decode.close()
        self.prefill.close()


def measure(model: Path, logs: Path, prefill_tp: int, decode_tp: int, port: int,
            nixl_first: bool) -> dict[str, Pair]:  # fmt: skip
    """Each connector's pair on its own (only its instances up: an idle NIXL agent keeps a
    core busy, and another pair's would weigh on this one's figures), the first round a
    warm-up (handshakes). Which connector goes first alternates from pair to pair, so a drift
    in what else runs on this shared machine weighs on both. A connector that cannot serve
    the pair is left out."""
    pairs: dict[str, Pair] = {}
    order = ("nixl", "pdplan", "pdplan-spin")
    order = order if nixl_first else order[::-1]
    for offset, connector in enumerate(order):
        pair = None
        try:
            pair = Pair(model, logs, connector, prefill_tp, decode_tp, port + 20 * offset)
            for round_ in range(ROUNDS + 1):
                pair.round(round_, kept=round_ > 0)
            pairs[connector] = pair
            print(pair.name, "ms:", " ".join(f"{t * 1e3:.1f}" for t in pair.times), flush=True)
        except Exception as error:  # a pair a connector does not serve
            print(f"{connector} {prefill_tp} -> {decode_tp}: {error}", flush=True)
        finally:
            if pair is not None:
                pair.close()
    return pairs


def cells(medians: dict[str, float]) -> list[str]:
    """NixlConnector's, then pdplan's and pdplan's with NIXL's spinning progress loop, each
    with its ratio to NixlConnector's; "fails" for a connector that did not run."""
    out = [f"{medians['nixl']:.1f}" if "nixl" in medians else "fails"]
    for connector in ("pdplan", "pdplan-spin"):
        if connector not in medians:
            out += ["fails", "—"]
            continue
        ratio = medians[connector] / medians["nixl"] if "nixl" in medians else None
        out += [f"{medians[connector]:.1f}", f"{ratio:.2f}" if ratio is not None else "—"]
    return out


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
        port += 80
        pairs = measure(models[heads], work, prefill_tp, decode_tp, port, len(rows) % 2 == 0)
        ttft = {c: statistics.median(p.times) * 1e3 for c, p in pairs.items()}
        moved = {c: statistics.median(p.transfers) * 1e3 for c, p in pairs.items()}
        rows.append(" | ".join([
            f"| {heads} | {prefill_tp} -> {decode_tp}",
            *cells(ttft), *cells(moved),
        ]) + " |")  # fmt: skip
        print(rows[-1], flush=True)
    table = "\n".join([
        f"Decode time to first token for {len(LENGTHS)} requests of {', '.join(map(str, LENGTHS))} "
        f"tokens whose KV the prefill instance holds (the pull, then one decode step), median "
        f"of {ROUNDS} rounds after a warm-up, one connector's instances up at a time (which goes "
        "first alternating from pair to pair); tiny fp32 Llama (2 layers, KV heads of 64), "
        "vLLM 0.32 CPU backend, block 32, both through NIXL 1.5.1 (UCX, loopback). Transfer: "
        "the median request's time from the step that hands it to the connector to the step "
        "that reports it received (its slowest decode rank). \"fails\": the connector does not "
        "serve the pair (the run's output says why). Both with their defaults: NixlConnector's "
        "NIXL agents poll without pause (a core busy per instance, idle or not); "
        "PdplanConnector's progress threads sleep 10 µs between polls "
        "(nixl_progress_delay_us); \"NIXL spinning\" is PdplanConnector with "
        "nixl_progress_delay_us=0, NIXL's own loop, for the connector's cost alone.",
        "",
        "| KV heads | prefill TP -> decode TP | TTFT, NixlConnector (ms) | PdplanConnector | "
        "ratio | PdplanConnector, NIXL spinning | ratio | transfer, NixlConnector (ms) | "
        "PdplanConnector | ratio | PdplanConnector, NIXL spinning | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
    ])  # fmt: skip
    write("vllm_connectors.md", table)


if __name__ == "__main__":
    main()

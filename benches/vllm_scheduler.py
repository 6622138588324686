"""The connectors' scheduler side inside vLLM's real ``Scheduler`` (no engine, no workers): 256
requests wait at once, then the scheduler steps until every one ended, the model runner's
output written by hand (a token a scheduled request; a pulled request reported received the
step after it was handed to the connector). A decode instance (every request pulls) and a
prefill instance (every request is for a decode side) for each of NixlConnector and
PdplanConnector, the same requests and steps. Figures: the connector's own time per engine step
(the hooks vLLM's scheduler calls, wrapped as benches/serve_timed.py wraps them), and the
scheduler's whole step (``schedule`` and ``update_from_output``), median of the rounds. With
``--profile`` it prints where PdplanConnector's decode side spends its time. Needs vLLM
(scripts/install_vllm.sh).

    python benches/vllm_scheduler.py   # writes benches/results/vllm_scheduler.md
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benches"))

os.environ.setdefault("VLLM_NIXL_SIDE_CHANNEL_PORT", "5897")

import serve_timed  # noqa: E402
from tiny_model import write_model  # noqa: E402

from provenance import write  # noqa: E402

REQUESTS = 256
BLOCK = 32
BLOCKS = 16384
#: Prompt tokens and decode tokens, drawn uniformly (the load benchmark's).
PROMPT_TOKENS = (16, 400)
DECODE_TOKENS = (8, 32)
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]


class Totals(serve_timed.Side):
    """A side's hook time and steps, kept in memory."""

    def __init__(self) -> None:
        super().__init__("scheduler", "")

    def step(self) -> None:
        self.steps += 1


def connector(kind: str, role: str) -> dict[str, Any]:
    if kind == "nixl":
        return {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}
    return {"kv_connector": "PdplanConnector", "kv_connector_module_path": "pdplan.connectors.vllm",
            "kv_role": role, "kv_buffer_device": "cpu",
            "kv_connector_extra_config": {"side_channel_port": 5898}}  # fmt: skip


def scheduler(model: Path, kind: str, role: str) -> Any:
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    vllm_config = VllmConfig(
        model_config=ModelConfig(model=str(model), skip_tokenizer_init=True, dtype="float32",
                                 max_model_len=512),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        scheduler_config=SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=REQUESTS,
                                         max_model_len=512, is_encoder_decoder=False),
        kv_transfer_config=KVTransferConfig(**connector(kind, role)),
        device_config=DeviceConfig("cpu"),
    )  # fmt: skip
    vllm_config.cache_config.num_gpu_blocks = BLOCKS
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.float32)
    size = spec.page_size_bytes * BLOCKS
    tensors = [KVCacheTensor(size=size, layers=[n], layer_stride=size,
                             block_stride=spec.page_size_bytes) for n in LAYERS]  # fmt: skip
    cache = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=tensors,
                          kv_cache_groups=[KVCacheGroupSpec(LAYERS, spec)])  # fmt: skip
    args: dict[str, Any] = dict(
        vllm_config=vllm_config,
        kv_cache_config=cache,
        block_size=BLOCK,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )
    if "hash_block_size" in inspect.signature(Scheduler.__init__).parameters:
        args["hash_block_size"] = BLOCK
    return Scheduler(**args)


def requests(role: str, seed: int) -> list[Any]:
    """The same 256 requests for both connectors: a decode request carries what a prefill
    side returned (every key both connectors read), a prefill request asks for a decode side."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    draw = random.Random(seed)
    made = []
    for i in range(REQUESTS):
        prompt = [draw.randrange(1, 500) for _ in range(draw.randint(*PROMPT_TOKENS))]
        if role == "kv_consumer":
            blocks = list(range(i * 16, i * 16 + -(-len(prompt) // BLOCK)))
            params: dict[str, Any] = {
                "do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": [blocks], "remote_engine_id": "prefill-engine",
                "remote_request_id": f"p-{i}", "remote_host": "127.0.0.1",
                "remote_port": 5600, "tp_size": 1, "dcp_size": 1, "pp_size": 1,
                "remote_num_tokens": len(prompt),
                "remote_blocks_expiry_time": time.time() + 60, "transfer_mode": "pull",
            }  # fmt: skip
            tokens = draw.randint(*DECODE_TOKENS)
        else:
            params, tokens = {"do_remote_decode": True}, 1
        sampling = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True,
                                  extra_args={"kv_transfer_params": params})  # fmt: skip
        request = Request(f"r-{i}", prompt, sampling, None)
        if request.kv_transfer_params is None:
            request.kv_transfer_params = params
        made.append(request)
    return made


def runner_output(step: Any, received: set[str]) -> Any:
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

    ids = list(step.num_scheduled_tokens)
    fields = dict(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[7] for _ in ids],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[None] * len(ids),
        kv_connector_output=KVConnectorOutput(finished_recving=received or None),
    )
    known = inspect.signature(ModelRunnerOutput).parameters
    return ModelRunnerOutput(**{k: v for k, v in fields.items() if k in known})


def pulled(step: Any) -> set[str]:
    """The requests a step handed the connector to read (either connector's metadata)."""
    meta = step.kv_connector_metadata
    if hasattr(meta, "receives"):
        return {r.request_id for r in meta.receives if r.remote_blocks}
    return set(getattr(meta, "reqs_to_recv", {}) or {})


def run(model: Path, kind: str, role: str, seed: int) -> dict[str, float]:
    """One round: the requests arrive, the scheduler steps until they all ended."""
    sched = scheduler(model, kind, role)
    totals = Totals()
    cls = type(sched.connector)
    serve_timed._wrap(cls, serve_timed.SCHEDULER_HOOKS, totals)
    step_times = []
    try:
        for request in requests(role, seed):
            sched.add_request(request)
        received: set[str] = set()
        for _ in range(4000):
            if not sched.get_num_unfinished_requests() and not received:
                break
            started = time.perf_counter()
            step = sched.schedule()
            now = pulled(step)
            sched.update_from_output(step, runner_output(step, received))
            step_times.append(time.perf_counter() - started)
            received = now
    finally:
        for name in serve_timed.SCHEDULER_HOOKS:  # unwrap: the next round times afresh
            wrapped = cls.__dict__.get(name)
            if wrapped is not None and hasattr(wrapped, "__wrapped__"):
                setattr(cls, name, wrapped.__wrapped__)
    if sched.get_num_unfinished_requests():
        raise RuntimeError(f"{kind} {role}: requests left after the steps")
    return {
        "hooks_us": totals.seconds / max(totals.steps, 1) * 1e6,
        "step_us": statistics.mean(step_times) * 1e6,
        "steps": float(len(step_times)),
    }


def profile(model: Path) -> None:
    found = cProfile.Profile()
    found.enable()
    for seed in range(3):
        run(model, "pdplan", "kv_consumer", seed)
    found.disable()
    stats = pstats.Stats(found).sort_stats("tottime")
    stats.print_stats("site-packages/pdplan/", 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--profile", action="store_true", help="print pdplan's decode profile")
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as folder:
        model = write_model(Path(folder) / "tiny")
        if args.profile:
            profile(model)
            return
        rows = []
        for role, side in (("kv_consumer", "decode"), ("kv_producer", "prefill")):
            figures: dict[str, list[dict[str, float]]] = {"nixl": [], "pdplan": []}
            for seed in range(args.rounds):
                for kind in ("nixl", "pdplan") if seed % 2 else ("pdplan", "nixl"):
                    figures[kind].append(run(model, kind, role, seed))
            for key, label in (("hooks_us", "connector hooks (µs/step)"),
                               ("step_us", "whole scheduler step (µs)")):  # fmt: skip
                nixl = statistics.median(f[key] for f in figures["nixl"])
                ours = statistics.median(f[key] for f in figures["pdplan"])
                rows.append(f"| {side} | {label} | {nixl:.1f} | {ours:.1f} | {ours / nixl:.2f} |")
                print(rows[-1], flush=True)
            steps = statistics.median(f["steps"] for f in figures["pdplan"])
            rows.append(f"| {side} | steps a round | "
                        f"{statistics.median(f['steps'] for f in figures['nixl']):.0f} | "
                        f"{steps:.0f} | |")  # fmt: skip
    text = "\n".join([
        f"{REQUESTS} requests waiting at once in vLLM's real `Scheduler` (vLLM 0.32, block "
        f"{BLOCK}, {BLOCKS} blocks, up to {REQUESTS} running, 4,096 tokens a step), prompts of "
        f"{PROMPT_TOKENS[0]}-{PROMPT_TOKENS[1]} tokens and {DECODE_TOKENS[0]}-{DECODE_TOKENS[1]} "
        "decode tokens drawn per request (the same draws for both connectors), stepped until "
        "every request ended; the model runner's output written by hand (no engine, no "
        "workers: the scheduler side alone). Connector hooks: the time inside the hooks the "
        "scheduler calls, summed per step (benches/serve_timed.py's wrapping); whole step: "
        f"`schedule` plus `update_from_output`. Medians of {args.rounds} rounds, the "
        "connectors alternating first.",
        "",
        "| instance | figure | NixlConnector | PdplanConnector | ratio |",
        "| --- | --- | --- | --- | --- |",
        *rows,
    ])  # fmt: skip
    write("vllm_scheduler.md", text)
    os._exit(0)  # NIXL's modules may crash the interpreter at exit; the results are out


if __name__ == "__main__":
    main()

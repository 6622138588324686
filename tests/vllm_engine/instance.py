"""One vLLM instance driven by a test: started as its own process (vLLM spawns its workers,
so it needs a __main__ of its own), it connects back to the test and answers commands.

    python instance.py ADDRESS_PORT AUTHKEY_HEX CONFIG_JSON
"""

from __future__ import annotations

import json
import os
import sys
import time
from multiprocessing.connection import Client
from typing import Any

import timing

# At the top, so workers vLLM forks or spawns (which import this module) are timed too.
timing.install()


def free_blocks(llm: Any) -> int:
    core = llm.llm_engine.engine_core.engine_core
    return int(core.scheduler.kv_cache_manager.block_pool.get_num_free_blocks())


def step_until(llm: Any, free: int, seconds: float) -> int:
    """Steps the engine (which polls the connector) until ``free`` blocks are free."""
    deadline = time.monotonic() + seconds
    now = free_blocks(llm)
    while now < free and time.monotonic() < deadline:
        llm.llm_engine.step()
        time.sleep(0.02)
        now = free_blocks(llm)
    return now


def corrupt_kv(llm: Any) -> None:
    """Overwrites every KV cache block of every layer with noise (the control)."""

    def scramble(worker: Any) -> None:
        import torch

        for tensors in worker.model_runner.kv_caches:
            for t in tensors if isinstance(tensors, (list, tuple)) else [tensors]:
                t.copy_(torch.randn_like(t.float()).to(t.dtype) * 3)

    llm.collective_rpc(scramble)


def generate_aborting(
    llm: Any, prompts: list[list[int]], params: list[dict[str, Any]], abort: list[int],
    after_steps: int = 0,
) -> dict[int, list[int]]:  # fmt: skip
    """Adds every request at once, aborts those of ``abort`` after ``after_steps`` steps (0:
    before any), and steps until the rest finish: their tokens by index."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    for i, (ids, p) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), {"prompt_token_ids": ids}, SamplingParams(**p))
    for _ in range(after_steps):
        engine.step()
    engine.abort_request([str(i) for i in abort])
    done: dict[int, list[int]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                done[int(output.request_id)] = list(output.outputs[0].token_ids)
    return done


def main() -> None:
    port, key, config = int(sys.argv[1]), bytes.fromhex(sys.argv[2]), json.loads(sys.argv[3])
    from vllm import LLM, SamplingParams

    llm = LLM(**config["llm"])
    conn = Client(("127.0.0.1", port), authkey=key)
    conn.send(("ready", free_blocks(llm)))
    while True:
        command, args = conn.recv()
        if command == "generate":
            params = [SamplingParams(**p) for p in args["params"]]
            prompts = [{"prompt_token_ids": ids} for ids in args["prompts"]]
            outputs = llm.generate(prompts, params, use_tqdm=False)
            conn.send([
                {"tokens": list(o.outputs[0].token_ids),
                 "kv_transfer_params": o.kv_transfer_params,
                 "finish_reason": o.outputs[0].finish_reason}
                for o in outputs
            ])  # fmt: skip
        elif command == "generate_aborting":
            conn.send(generate_aborting(llm, args["prompts"], args["params"], args["abort"],
                                        args.get("after_steps", 0)))  # fmt: skip
        elif command == "free_blocks":
            conn.send(free_blocks(llm))
        elif command == "step_until":
            conn.send(step_until(llm, args["free"], args["seconds"]))
        elif command == "corrupt":
            corrupt_kv(llm)
            conn.send(True)
        elif command == "exit":
            conn.send(True)
            conn.close()
            os._exit(0)


if __name__ == "__main__":
    main()

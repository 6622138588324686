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

import landed
import timing

# At the top, so workers vLLM forks or spawns (which import this module) are timed too.
timing.install()
landed.install()


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


def group_layers(worker: Any, specs: list[str] | None) -> list[str]:
    """The layers of the KV cache groups whose spec class is one of ``specs`` (all: None)."""
    names = []
    for group in worker.model_runner.kv_cache_config.kv_cache_groups:
        if specs is None or type(group.kv_cache_spec).__name__ in specs:
            names += list(group.layer_names)
    return names


def corrupt_kv(llm: Any, specs: list[str] | None = None, conv_tail: int = 0) -> None:
    """Overwrites every block of the layers of the groups of ``specs`` (every layer: None)
    with noise, through the layers' own views (the control). ``conv_tail``: only the last
    ``conv_tail`` channels of a recurrent layer's conv state (its first tensor, channels
    last: Mamba2's B and C), on every rank."""

    def scramble(worker: Any) -> int:
        import torch

        layers = worker.vllm_config.compilation_config.static_forward_context
        names = group_layers(worker, specs)
        for name in names:
            cache = layers[name].kv_cache
            tensors = list(cache) if isinstance(cache, (list, tuple)) else [cache]
            if conv_tail:
                tensors = [tensors[0][..., -conv_tail:]]
            for t in tensors:
                t.copy_((torch.randn_like(t.float()) * 3).to(t.dtype))
        return len(names)

    assert all(llm.collective_rpc(scramble)), "no layer of those groups"


def external_tokens(llm: Any) -> int:
    """vLLM's count of prompt tokens it took from external KV transfer, not computing them
    (``vllm:prompt_tokens_by_source{source="external_kv_transfer"}``; needs its stats on)."""
    return sum(
        int(getattr(metric, "value", 0))
        for metric in llm.get_metrics()
        if metric.name == "vllm:prompt_tokens_by_source"
        and metric.labels.get("source") == "external_kv_transfer"
    )


def preemptions(llm: Any) -> int:
    """How many times the scheduler preempted a request (``vllm:num_preemptions``)."""
    return sum(int(getattr(metric, "value", 0)) for metric in llm.get_metrics()
               if metric.name == "vllm:num_preemptions")  # fmt: skip


def token_rows(llm: Any, blocks: list[int], tokens: int) -> list[list[list[str]]]:
    """Per worker, per layer of the cache (model order), a digest of each of the first
    ``tokens`` token rows of the request whose blocks are ``blocks``: an MLA latent's bytes
    a token, read from the engine's own cache."""

    def digest(worker: Any) -> list[list[str]]:
        import hashlib

        import torch

        out = []
        for cache in worker.model_runner.kv_caches:
            rows = cache.reshape(cache.shape[0], -1, cache.shape[-1])  # [blocks, tokens, width]
            per_block = rows.shape[1]
            picked = [rows[blocks[t // per_block], t % per_block] for t in range(tokens)]
            out.append([
                hashlib.sha256(r.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
                for r in picked
            ])  # fmt: skip
        return out

    return llm.collective_rpc(digest)


def all_token_rows(llm: Any) -> list[list[set[str]]]:
    """Per worker, per layer, the digests of every token row of the whole cache."""

    def digest(worker: Any) -> list[set[str]]:
        import hashlib

        import torch

        out = []
        for cache in worker.model_runner.kv_caches:
            rows = cache.reshape(-1, cache.shape[-1]).contiguous().view(torch.uint8).numpy()
            out.append({hashlib.sha256(r.tobytes()).hexdigest() for r in rows})
        return out

    return llm.collective_rpc(digest)


def _block_bytes(worker: Any, groups: list[list[int]]) -> dict[str, list[Any]]:
    runner = worker.model_runner
    return landed.block_bytes(worker.vllm_config, runner.kv_cache_config, groups)


def _layer_blocks(worker: Any) -> dict[str, int]:
    """Each layer's tokens a block, as its KV cache group's spec says (vLLM may set a group's
    blocks otherwise than asked: CPU_MLA's are 16 tokens, a hybrid's attention blocks follow
    its state pages)."""
    return {
        name: int(group.kv_cache_spec.block_size)
        for group in worker.model_runner.kv_cache_config.kv_cache_groups
        for name in group.layer_names
    }


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


def generate_behind(
    llm: Any, fillers: list[list[int]], filler_tokens: int, prompts: list[list[int]],
    params: list[dict[str, Any]],
) -> dict[int, list[int]]:  # fmt: skip
    """Adds ``fillers`` (decoding ``filler_tokens`` each, local) first, then ``prompts``: with
    ``max_num_seqs`` fillers, the prompts wait in the queue until the fillers finish. Steps
    until all finish: the prompts' tokens by index."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    greedy = SamplingParams(max_tokens=filler_tokens, temperature=0.0, ignore_eos=True)
    for i, ids in enumerate(fillers):
        engine.add_request(f"filler-{i}", {"prompt_token_ids": ids}, greedy)
    for i, (ids, p) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), {"prompt_token_ids": ids}, SamplingParams(**p))
    done: dict[int, list[int]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished and not output.request_id.startswith("filler-"):
                done[int(output.request_id)] = list(output.outputs[0].token_ids)
    return done


def main() -> None:
    port, key, config = int(sys.argv[1]), bytes.fromhex(sys.argv[2]), json.loads(sys.argv[3])
    if os.environ.get("PDPLAN_INIT_AMX"):
        import torch

        torch.cpu._init_amx()  # a bf16 instance may die of SIGILL without it
    from vllm import LLM, SamplingParams

    llm = LLM(**config["llm"])
    conn = Client(("127.0.0.1", port), authkey=key)
    conn.send(("ready", free_blocks(llm)))
    serving = bool(config.get("serve"))
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    while True:
        # Serving, the engine steps between commands while it has work, as a server's busy
        # loop does (a finished request's blocks wait for its readers: its lease reaches
        # the workers, and frees, only in steps).
        while serving and not conn.poll(0.02):
            if scheduler.has_requests():
                llm.llm_engine.step()
        command, args = conn.recv()
        if command == "generate":
            params = [SamplingParams(**p) for p in args["params"]]
            prompts = [{"prompt_token_ids": ids} for ids in args["prompts"]]
            outputs = llm.generate(prompts, params, use_tqdm=False)
            conn.send([
                {"tokens": list(o.outputs[0].token_ids),
                 "kv_transfer_params": o.kv_transfer_params,
                 "finish_reason": o.outputs[0].finish_reason,
                 "num_cached_tokens": o.num_cached_tokens}
                for o in outputs
            ])  # fmt: skip
        elif command == "generate_aborting":
            conn.send(generate_aborting(llm, args["prompts"], args["params"], args["abort"],
                                        args.get("after_steps", 0)))  # fmt: skip
        elif command == "generate_behind":
            conn.send(generate_behind(llm, args["fillers"], args["filler_tokens"],
                                      args["prompts"], args["params"]))  # fmt: skip
        elif command == "free_blocks":
            conn.send(free_blocks(llm))
        elif command == "step_until":
            conn.send(step_until(llm, args["free"], args["seconds"]))
        elif command == "corrupt":
            if isinstance(args, dict):
                corrupt_kv(llm, args["specs"], args.get("conv_tail", 0))
            else:
                corrupt_kv(llm, args)
            conn.send(True)
        elif command == "preemptions":
            conn.send(preemptions(llm))
        elif command == "external_tokens":
            conn.send(external_tokens(llm))
        elif command == "token_rows":
            conn.send(token_rows(llm, args["blocks"], args["tokens"]))
        elif command == "layer_blocks":
            conn.send(llm.collective_rpc(_layer_blocks)[0])
        elif command == "block_bytes":
            conn.send(llm.collective_rpc(_block_bytes, args=(args,)))
        elif command == "all_token_rows":
            conn.send(all_token_rows(llm))
        elif command == "exit":
            # The engine first: an instance of TP 2 runs its workers in processes of their
            # own, which outlive an exit that skips its shutdown (holding memory and ports).
            try:
                llm.llm_engine.engine_core.shutdown(timeout=10)
            except Exception:  # the exit goes on: the test is done with the instance
                pass
            conn.send(True)
            conn.close()
            os._exit(0)


if __name__ == "__main__":
    main()

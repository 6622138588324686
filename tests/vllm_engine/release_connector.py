"""Drives PdplanConnector inside one vLLM release and prints what it saw as JSON: its
scheduler side inside the release's real ``Scheduler`` (its model runner's output written by
hand, as vLLM's own connector unit tests do), then its worker side under the release's
distributed state, a prefill and a decode worker in this process moving the request's blocks
through NIXL, caches shaped as vLLM's CPU backend shapes them. Run by ``test_releases.py``
under each supported release: 0.32 as installed, 0.33 and 0.34 from their CUDA wheels' Python
(their schedulers, connector API and distributed state import and run on a CPU; their model
runners need the CUDA build's compiled ops).

    python release_connector.py MODEL_FOLDER"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
from typing import Any

import torch
import vllm
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from pdplan.connectors.vllm import PdplanConnector
from pdplan.connectors.vllm._connector import RegisteredAgain, Registration
from pdplan.connectors.vllm._metadata import StepMetadata

BLOCKS, BLOCK = 64, 32
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
PROMPT = list(range(1, 71))  # 70 tokens: 3 blocks


def config(model: str, role: str) -> VllmConfig:
    transfer = KVTransferConfig(
        kv_connector="PdplanConnector", kv_connector_module_path="pdplan.connectors.vllm",
        kv_role=role, kv_buffer_device="cpu",
        kv_connector_extra_config={"side_channel_port": 5990},
    )  # fmt: skip
    scheduler = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8, max_model_len=512,
                                is_encoder_decoder=False)  # fmt: skip
    out = VllmConfig(
        model_config=ModelConfig(
            model=model, skip_tokenizer_init=True, dtype="float32", max_model_len=512
        ),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        scheduler_config=scheduler, kv_transfer_config=transfer, device_config=DeviceConfig("cpu"),
    )  # fmt: skip
    out.cache_config.num_gpu_blocks = BLOCKS
    return out


def scheduler_cache_config() -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.float32)
    size = spec.page_size_bytes * BLOCKS
    tensors = [KVCacheTensor(size=size, layers=[n], layer_stride=size,
                             block_stride=spec.page_size_bytes) for n in LAYERS]  # fmt: skip
    return KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=tensors,
                         kv_cache_groups=[KVCacheGroupSpec(LAYERS, spec)])  # fmt: skip


def scheduler(vllm_config: VllmConfig) -> Scheduler:
    cache = scheduler_cache_config()
    args: dict[str, Any] = dict(vllm_config=vllm_config, kv_cache_config=cache,
                                structured_output_manager=StructuredOutputManager(vllm_config),
                                block_size=BLOCK)  # fmt: skip
    if "hash_block_size" in inspect.signature(Scheduler.__init__).parameters:
        args["hash_block_size"] = BLOCK
    return Scheduler(**args)


def runner_output(step: Any, kv: KVConnectorOutput | None = None) -> ModelRunnerOutput:
    """What the model runner returns: one token a scheduled request (fields by release)."""
    ids = list(step.num_scheduled_tokens)
    fields = dict(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                  sampled_token_ids=[[7] for _ in ids], logprobs=None, prompt_logprobs_dict={},
                  pooler_output=[None] * len(ids), kv_connector_output=kv)  # fmt: skip
    known = inspect.signature(ModelRunnerOutput).parameters
    return ModelRunnerOutput(**{k: v for k, v in fields.items() if k in known})


def request(name: str, params: dict[str, Any], max_tokens: int) -> Request:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0,
                              extra_args={"kv_transfer_params": params})  # fmt: skip
    made = Request(name, list(PROMPT), sampling, None)
    if made.kv_transfer_params is None:
        made.kv_transfer_params = params
    return made


def workers(model: str, leases: Any, receiving: Any) -> dict[str, Any]:
    """A prefill and a decode worker in this process: the prefill one serves ``leases``'
    blocks, the decode one reads ``receiving``'s through NIXL; the decode cache's blocks are
    compared with the prefill cache's."""
    import socket
    import types

    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.parallel_state import (
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend as backend

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(config(model, "kv_both")):  # as a worker starts
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{free}")  # fmt: skip
        ensure_model_parallel_initialized(1, 1)
    torch.manual_seed(0)
    caches = {}
    connectors = {}
    for role, kind in (("kv_producer", "prefill"), ("kv_consumer", "decode")):
        vllm_config = config(model, role)
        # The layers as the model runner registers them: each names its attention backend.
        vllm_config.compilation_config.static_forward_context = {
            name: types.SimpleNamespace(attn_backend=backend) for name in LAYERS
        }
        made = scheduler_cache_config()
        connector = PdplanConnector(vllm_config, KVConnectorRole.WORKER, made)
        # vLLM's CPU backend: (blocks, KV heads, block size, 2 x head size) a layer.
        shape = (BLOCKS, 2, BLOCK, 2 * 64)
        tensors = {n: (torch.randn(shape) if kind == "prefill" else torch.zeros(shape))
                   for n in LAYERS}  # fmt: skip
        connector.register_kv_caches(tensors)
        caches[kind], connectors[kind] = tensors, connector
    prefill, decode = connectors["prefill"], connectors["decode"]
    prefill.bind_connector_metadata(leases)
    prefill.start_load_kv(None)
    prefill.wait_for_save()
    prefill.clear_connector_metadata()
    decode.bind_connector_metadata(receiving)
    decode.start_load_kv(None)
    decode.clear_connector_metadata()
    received: set[str] = set()
    deadline = time.monotonic() + 60
    while "d-1" not in received and time.monotonic() < deadline:
        received |= decode.get_finished(set())[1] or set()
        time.sleep(0.01)
    [receive] = receiving.receives
    local, remote = list(receive.local_blocks[0]), list(receive.remote_blocks[0])
    exact = all(
        torch.equal(caches["decode"][n][local], caches["prefill"][n][remote]) for n in LAYERS
    )
    others = [b for b in range(BLOCKS) if b not in local]
    untouched = all(not caches["decode"][n][others].any() for n in LAYERS)
    stats = decode.get_kv_connector_stats()
    out = {"received": sorted(received), "exact": exact, "untouched": untouched,
           "bytes_read": stats.data["counts"].get("bytes_read") if stats else None,
           "load_errors": sorted(decode.get_block_ids_with_load_errors())}  # fmt: skip

    # A weight reload: the prefill worker drops and remakes its registration, tells its
    # scheduler once, and its pages change; a request naming the new generation is read
    # through the new registration (the decode worker handshakes anew).
    prefill.unregister_kv_caches()
    prefill.restore_kv_caches()
    told = [prefill.build_connector_worker_meta(), prefill.build_connector_worker_meta()]
    out["told_after_reload"] = [None if t is None else t.generation for t in told]
    out["handshake_generation"] = prefill.get_handshake_metadata().generation
    for name in LAYERS:
        caches["prefill"][name].copy_(torch.randn(caches["prefill"][name].shape))
        caches["decode"][name].zero_()
    newer = receive._replace(request_id="d-2", remote=receive.remote._replace(generation=2))
    older = receive._replace(request_id="d-3", remote=receive.remote._replace(generation=1))
    for reading in (newer, older):
        decode.bind_connector_metadata(StepMetadata(receives=[reading]))
        decode.start_load_kv(None)
        decode.clear_connector_metadata()
        got: set[str] = set()
        deadline = time.monotonic() + 60
        while reading.request_id not in got and time.monotonic() < deadline:
            got |= decode.get_finished(set())[1] or set()
            time.sleep(0.01)
        out[f"{reading.request_id}_received"] = sorted(got)
        out[f"{reading.request_id}_load_errors"] = sorted(decode.get_block_ids_with_load_errors())
        out[f"{reading.request_id}_exact"] = all(
            torch.equal(caches["decode"][n][local], caches["prefill"][n][remote]) for n in LAYERS
        )
        if reading is newer:
            for name in LAYERS:
                caches["decode"][name].zero_()
    out["older_left_zero"] = all(not caches["decode"][n].any() for n in LAYERS)
    return out


def overridden_signatures() -> dict[str, list[str]]:
    """The base's methods the connector overrides whose parameters differ from the base's."""
    differing = {}
    for name, ours in vars(PdplanConnector).items():
        base = getattr(KVConnectorBase_V1, name, None)
        if name.startswith("_") or base is None:
            continue
        ours_fn = ours.__func__ if isinstance(ours, classmethod) else ours
        if not callable(ours_fn) or not callable(base):
            continue
        mine = list(inspect.signature(ours_fn).parameters)
        theirs = list(inspect.signature(base).parameters)
        if isinstance(ours, classmethod):
            mine = mine[1:]
        if mine != theirs:
            differing[name] = [str(mine), str(theirs)]
    return differing


def main() -> None:
    model = sys.argv[1]
    seen: dict[str, Any] = {"version": vllm.__version__}
    prefill_config = config(model, "kv_producer")
    transfer = prefill_config.kv_transfer_config
    seen["supports_sleep_mode"] = PdplanConnector.supports_sleep_mode(transfer)
    access = getattr(transfer, "registers_kv_cache_memory", None)
    seen["registers_kv_cache_memory"] = None if access is None else bool(access())
    seen["base_hooks"] = sorted(n for n in ("kv_cache_access", "unregister_kv_caches",
                                            "restore_kv_caches", "supports_sleep_mode")
                                if hasattr(KVConnectorBase_V1, n))  # fmt: skip
    seen["differing_signatures"] = overridden_signatures()

    # The prefill instance: its workers registered twice (a weight reload), as their
    # handshake metadata tells the scheduler.
    prefill = scheduler(prefill_config)
    prefill.connector.set_xfer_handshake_metadata({0: Registration(2), 1: Registration(1)})
    first = request("p-1", {"do_remote_decode": True}, 1)
    prefill.add_request(first)
    step = prefill.schedule()
    outputs = prefill.update_from_output(step, runner_output(step))
    finished = [o for batch in outputs.values() for o in batch.outputs]
    params = finished[0].kv_transfer_params
    seen["prefill_params"] = params
    seen["prefill_blocks_held"] = prefill.connector.has_pending_block_frees()

    # A weight reload: a worker registers again and says so with a step's output, which
    # vLLM hands its scheduler; the next request names the new generation.
    reloaded = request("p-2", {"do_remote_decode": True}, 1)
    prefill.add_request(reloaded)
    step = prefill.schedule()
    leases = step.kv_connector_metadata  # p-1's blocks held for the decode side
    told = KVConnectorOutput(kv_connector_worker_meta=RegisteredAgain(3))
    outputs = prefill.update_from_output(step, runner_output(step, told))
    step = prefill.schedule()  # the generation is the scheduler's from this step on
    again = request("p-3", {"do_remote_decode": True}, 1)
    prefill.add_request(again)
    step = prefill.schedule()
    outputs = prefill.update_from_output(step, runner_output(step))
    finished = [o for batch in outputs.values() for o in batch.outputs]
    seen["generation_after_reload"] = [
        o.kv_transfer_params["remote_registration_generation"] for o in finished
    ]

    # The decode instance: the proxy copies the params verbatim.
    decode = scheduler(config(model, "kv_consumer"))
    second = request("d-1", dict(params), 4)
    decode.add_request(second)
    step = decode.schedule()
    receiving = step.kv_connector_metadata
    receives = receiving.receives
    seen["decode_waiting"] = str(second.status)
    seen["decode_receives"] = [
        [r.request_id, [list(g) for g in r.local_blocks], [list(g) for g in r.remote_blocks],
         r.remote.request_id, r.remote.port, r.remote.generation] for r in receives
    ]  # fmt: skip
    decode.update_from_output(
        step, runner_output(step, KVConnectorOutput(finished_recving={"d-1"}))
    )
    step = decode.schedule()
    seen["decode_scheduled"] = dict(step.num_scheduled_tokens)
    seen["decode_computed"] = int(second.num_computed_tokens)
    seen["worker"] = workers(model, leases, receiving)
    print("RESULT " + json.dumps(seen, default=str), flush=True)
    os._exit(0)  # NIXL's agents crash the interpreter at exit; the result is out


if __name__ == "__main__":
    main()

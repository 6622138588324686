"""One worker's KV cache as pdplan sees it: the tensors ``register_kv_caches`` receives,
described by ``pdplan.runtimes.vllm`` (nothing re-derived here), each KV cache group's
buffers, and the memory regions an engine registers (each backing storage once)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from pdplan._arrays import CacheBuffers
from pdplan._core import UnsupportedPDLayoutError
from pdplan.runtimes import vllm as vllm_adapter


@dataclass(frozen=True)
class WorkerCache:
    """A rank's buffers, which buffers each KV cache group owns, and its identity: what must
    match the peer's for the two to pair (the model, its dtype, the scheduler's block)."""

    cache: CacheBuffers
    groups: tuple[tuple[int, ...], ...]
    block_size: int
    kernel_block_size: int
    identity: dict[str, Any]

    def identity_bytes(self) -> bytes:
        return json.dumps(self.identity, sort_keys=True).encode()


def backend_name(vllm_config: Any, kv_caches: dict[str, Any]) -> str:
    """The attention backend of the model's layers, as vLLM names it."""
    layers = vllm_config.compilation_config.static_forward_context
    names = set()
    for name in kv_caches:
        layer = layers.get(name)
        backend = getattr(layer, "attn_backend", None)
        if backend is not None:
            names.add(str(backend.get_name()))
    if len(names) != 1:
        raise UnsupportedPDLayoutError(
            f"PdplanConnector reads caches of one attention backend; the layers use "
            f"{sorted(names) or 'none pdplan can name'}"
        )
    return names.pop()


def describe(vllm_config: Any, kv_cache_config: Any, kv_caches: dict[str, Any]) -> WorkerCache:
    """The rank's cache, or a refusal naming what pdplan does not read."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_world_size

    tp_size = get_tensor_model_parallel_world_size()
    model = vllm_config.model_config
    backend = backend_name(vllm_config, kv_caches)
    cache = vllm_adapter.buffers(
        kv_caches,
        backend=backend,
        tp_size=tp_size,
        num_kv_heads=model.get_total_num_kv_heads(),
    )
    block_size = int(vllm_config.cache_config.block_size)
    kernel_pages = {b.page_size for b in cache.buffers if b.buffer_kind.value != "mamba_state"}
    kernel = kernel_pages.pop() if len(kernel_pages) == 1 else block_size
    return WorkerCache(
        cache=cache,
        groups=group_buffers(kv_cache_config, cache, len(kv_caches)),
        block_size=block_size,
        kernel_block_size=kernel,
        identity={
            # The model's name, not where it lies: hosts keep one model at different paths.
            "model": PurePath(str(model.model)).name,
            "dtype": str(model.dtype),
            "cache_dtype": str(vllm_config.cache_config.cache_dtype),
            "num_layers": len(kv_caches),
        },
    )


def group_buffers(
    kv_cache_config: Any, cache: CacheBuffers, num_layers: int
) -> tuple[tuple[int, ...], ...]:
    """Each KV cache group's buffer indexes, by its layers' model layer (vLLM's block ids are
    per group). Without the config, one group owns every buffer."""
    every = tuple(range(len(cache.buffers)))
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if not groups or len(groups) == 1:
        return (every,)
    owned: list[tuple[int, ...]] = []
    for group in groups:
        layers = {vllm_adapter.layer_index(name) for name in group.layer_names}
        owned.append(tuple(b.buffer_index for b in cache.buffers if b.layer in layers))
    if sorted(i for g in owned for i in g) != list(every):
        raise UnsupportedPDLayoutError(
            f"the {len(groups)} KV cache groups do not own each of the {len(every)} buffers "
            "once; PdplanConnector cannot tell which block ids name which buffer"
        )
    return tuple(owned)


def regions(kv_caches: dict[str, Any]) -> list[tuple[int, int]]:
    """Each backing storage once, ``(address, bytes)``: layers that view one storage (KV
    sharing, hybrid groups) register it once. Only host memory is read: caches on a device
    are refused (NixlConnector stages them through host buffers; pdplan does not yet)."""
    seen: dict[int, int] = {}
    for value in kv_caches.values():
        for tensor in value if isinstance(value, (list, tuple)) else [value]:
            if str(tensor.device.type) != "cpu":
                raise UnsupportedPDLayoutError(
                    f"PdplanConnector moves host (cpu) KV caches; this one is on "
                    f"{tensor.device}: run the CPU backend, or use NixlConnector for device "
                    "memory until pdplan registers it"
                )
            storage = tensor.untyped_storage()
            address, size = int(storage.data_ptr()), int(storage.nbytes())
            seen[address] = max(size, seen.get(address, 0))
    return sorted(seen.items())

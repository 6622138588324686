"""One worker's KV cache as pdplan sees it: the tensors ``register_kv_caches`` receives,
described by ``pdplan.runtimes.vllm`` (nothing re-derived here), each KV cache group vLLM made
with the buffers it owns and the cache pages its blocks span, and the memory regions an engine
registers (each backing storage once).

vLLM 0.32 hands the connector one view a layer (``CONNECTOR_VIEW``): an attention layer's in
its backend's shape, a recurrent layer's states packed into one byte row a block. The states
are unpacked as vLLM's own layers unpack them (``packed_states``, by the group's
``MambaSpec``), and described with the channel counts and parts pdplan's model readers give
for the model's config (``ModelShape.from_hf_config``, ``state_specs``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import Any

from pdplan._arrays import CacheBuffers, StateSpec, state_specs
from pdplan._core import UnsupportedPDLayoutError
from pdplan._layouts import ModelShape
from pdplan._model import BufferKind
from pdplan.runtimes import vllm as vllm_adapter
from pdplan.runtimes._vllm_groups import CacheGroup, cache_groups
from pdplan.session import GroupCache, Memory, WorkerCache


def _attention_backend(vllm_config: Any, names: Sequence[str]) -> tuple[str | None, str | None]:
    """The attention backend of the attention layers ``names``, as vLLM names it, and the
    ISA of its kernel where it names one (the CPU backend's); None without attention
    layers."""
    layers = vllm_config.compilation_config.static_forward_context
    found = set()
    for name in names:
        layer = layers.get(name)
        backend = getattr(layer, "attn_backend", None)
        if backend is None:
            raise UnsupportedPDLayoutError(
                f"the attention layer {name} names no attention backend pdplan can read"
            )
        isa = getattr(layer, "isa", None)
        found.add((str(backend.get_name()), None if isa is None else str(isa)))
    if len(found) > 1:
        raise UnsupportedPDLayoutError(
            f"PdplanConnector reads attention layers of one backend; the layers use {sorted(found)}"
        )
    return found.pop() if found else (None, None)


def _model_shape(model_config: Any) -> ModelShape:
    """The model as pdplan's readers read its config: the folder vLLM loaded it from, else
    the config vLLM parsed (a model named by its hub id)."""
    folder = Path(str(model_config.model))
    if (folder / "config.json").is_file():
        return ModelShape.from_hf_config(folder)
    from pdplan import _core

    text = model_config.hf_config.to_json_string()
    return ModelShape._from_parts(_core.model_shape_parts(config_text=text, page_size=None))


def _state_specs(model_config: Any, layers: set[int]) -> dict[int, tuple[StateSpec, ...]]:
    """Each recurrent layer's state specs, by its model layer, from the model's config."""
    if not layers:
        return {}
    model_layers = _model_shape(model_config).model_layers
    specs = {}
    for layer in sorted(layers):
        if layer >= len(model_layers):
            raise UnsupportedPDLayoutError(
                f"vLLM keeps state for model layer {layer}; the model's config has "
                f"{len(model_layers)} layers"
            )
        specs[layer] = state_specs(model_layers[layer])
    return specs


def numbering(vllm_config: Any) -> vllm_adapter.LayerNumbering:
    """How the served model numbers the layers in its cache names. A draft model's layers
    among them (speculative decoding by EAGLE, MTP, a draft model) are refused when the
    instance starts, naming the method: vLLM numbers them past the model's layers or from 0
    under another prefix (``mtp.layers.0``, Qwen3-Next), so no name tells them apart."""
    speculative = getattr(vllm_config, "speculative_config", None)
    if speculative is not None and _draft_caches(speculative):
        raise UnsupportedPDLayoutError(
            f"speculative decoding by {speculative.method!r} keeps a draft model's KV cache "
            "beside the model's, which PdplanConnector does not plan; serve without it, or "
            "with a method that keeps none (ngram, suffix)"
        )
    hf_config = vllm_config.model_config.hf_config
    text = getattr(hf_config, "get_text_config", lambda: hf_config)()
    architectures = getattr(hf_config, "architectures", None) or [None]
    return vllm_adapter.LayerNumbering.of(text, architectures[0])


def _draft_caches(speculative: Any) -> bool:
    """Whether vLLM's speculative config keeps a draft's KV cache (its
    ``uses_draft_kv_cache``; releases without it: EAGLE-like methods and draft models)."""
    uses = getattr(speculative, "uses_draft_kv_cache", None)
    if callable(uses):
        return bool(uses())
    return bool(speculative.use_eagle() or speculative.method == "draft_model")


def describe(vllm_config: Any, kv_cache_config: Any, kv_caches: dict[str, Any]) -> WorkerCache:
    """The rank's cache, or a refusal naming what pdplan does not read."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_world_size

    tp_size = get_tensor_model_parallel_world_size()
    model = vllm_config.model_config
    layer_of = numbering(vllm_config)
    groups = cache_groups(kv_cache_config)
    group_of = {name: g for g in groups for name in g.layers}
    sharing = _sharing(vllm_config, kv_caches)
    unknown = sorted(set(kv_caches) - set(group_of) - set(sharing))
    if unknown:
        raise UnsupportedPDLayoutError(
            f"vLLM registered layers {unknown[:4]} in no KV cache group it transfers; "
            "PdplanConnector moves every layer's cache or none"
        )
    # A layer reading another's cache (KV sharing) is that layer's bytes: described once.
    kv_caches = {name: tensor for name, tensor in kv_caches.items() if name not in sharing}
    recurrent: set[int] = set()
    entries: dict[str, Any] = {}
    for name, tensor in kv_caches.items():
        if group_of[name].kind != "state":
            entries[name] = tensor
            continue
        # One byte row a block, the layer's states packed as vLLM's layers unpack them.
        spec = _group_spec(kv_cache_config, name)
        itemsizes = [int(dtype.itemsize) for dtype in spec.dtypes]
        entries[name] = vllm_adapter.packed_states(tensor, spec.shapes, itemsizes)
        recurrent.add(layer_of(name))
    attention = [name for name in kv_caches if group_of[name].kind != "state"]
    backend, isa = _attention_backend(vllm_config, attention)
    cache = vllm_adapter.buffers(
        entries,
        backend=backend,
        isa=isa,
        tp_size=tp_size,
        num_kv_heads=model.get_total_num_kv_heads() if attention else None,
        states=_state_specs(model, recurrent),
        numbering=layer_of,
    )
    architectures = getattr(model.hf_config, "architectures", None) or ["a model"]
    return WorkerCache(
        cache=cache,
        family=str(architectures[0])[:64],
        groups=_group_caches(groups, cache, layer_of),
        identity=identity(vllm_config, len(kv_caches), groups, isa),
        whole_pages=vllm_adapter.whole_pages(backend, isa),
    )


def identity(
    vllm_config: Any, num_layers: int, groups: Sequence[CacheGroup], isa: str | None
) -> dict[str, Any]:
    """What must match the peer's for two ranks to pair: the model, its dtypes, its layers and
    KV cache groups, and the CPU attention kernel's ISA (``amx`` tiles interleave a page's
    tokens otherwise than ``vec``: a host with AMX and one without lay out one block size
    differently)."""
    model = vllm_config.model_config
    return {
        # The model's name, not where it lies: hosts keep one model at different paths.
        "model": PurePath(str(model.model)).name,
        "dtype": str(model.dtype),
        "cache_dtype": str(vllm_config.cache_config.cache_dtype),
        "num_layers": num_layers,
        "cache_groups": [g.identity() for g in groups],
        "attention_kernel": isa,
    }


def _sharing(vllm_config: Any, kv_caches: dict[str, Any]) -> dict[str, str]:
    """Layers that keep no cache of their own but read another's (vLLM's KV sharing, Gemma
    3n's and 4's last layers: ``kv_sharing_target_layer_name``), by the layer they read; vLLM
    hands the connector their names too, each the same tensor as its target's. One whose
    tensor is not its target's is no sharing pdplan can read, and is left to be refused."""
    layers = vllm_config.compilation_config.static_forward_context
    found = {}
    for name, tensor in kv_caches.items():
        target = getattr(layers.get(name), "kv_sharing_target_layer_name", None)
        if target and kv_caches.get(target) is tensor:
            found[name] = str(target)
    return found


def _group_spec(kv_cache_config: Any, name: str) -> Any:
    """The spec of layer ``name``'s group (a layer's own where a group holds several)."""
    for group in kv_cache_config.kv_cache_groups:
        if name in group.layer_names:
            spec = group.kv_cache_spec
            if type(spec).__name__ == "UniformTypeKVCacheSpecs":
                return spec.kv_cache_specs[name]
            return spec
    raise UnsupportedPDLayoutError(f"layer {name} is in no KV cache group")


def _group_caches(
    groups: tuple[CacheGroup, ...], cache: CacheBuffers, layer_of: vllm_adapter.LayerNumbering
) -> tuple[GroupCache, ...]:
    """Each group's buffers (a layer's state buffers are its state group's, its KV buffers
    its attention group's) and its block-to-page rule; every buffer owned once."""
    owned: list[GroupCache] = []
    for group in groups:
        layers = {layer_of(name) for name in group.layers}
        state = group.kind == "state"
        mine = tuple(
            b.buffer_index
            for b in cache.buffers
            if b.layer in layers and (b.buffer_kind is BufferKind.MAMBA_STATE) == state
        )
        pages = {cache.buffers[i].page_size for i in mine}
        if state or not mine:
            kernel = group.block_size
        elif len(pages) == 1:
            kernel = pages.pop()
        else:
            raise UnsupportedPDLayoutError(
                f"the KV cache group of layers {list(group.layers)[:4]} holds pages of "
                f"{sorted(pages)} tokens; PdplanConnector reads one page size a group"
            )
        rules = vllm_adapter.conventions(block_size=group.block_size, kernel_block_size=kernel)
        owned.append(GroupCache(mine, rules, state))
    every = sorted(i for g in owned for i in g.buffers)
    if every != list(range(len(cache.buffers))):
        raise UnsupportedPDLayoutError(
            f"the {len(groups)} KV cache groups do not own each of the {len(cache.buffers)} "
            "buffers once; PdplanConnector cannot tell which block ids name which buffer"
        )
    return tuple(owned)


def regions(kv_caches: dict[str, Any], buffer_device: str) -> tuple[list[tuple[int, int]], Memory]:
    """Each backing storage once, ``(address, bytes)``, and the memory they are all in:
    layers that view one storage (KV sharing, hybrid groups) register it once. A cache in
    host memory or on one CUDA device is registered where it lives (no staging through host
    buffers), so ``kv_buffer_device`` must name the cache's own device."""
    seen: dict[int, int] = {}
    devices = set()
    for value in kv_caches.values():
        for tensor in value if isinstance(value, (list, tuple)) else [value]:
            devices.add((str(tensor.device.type), tensor.device.index))
            storage = tensor.untyped_storage()
            address, size = int(storage.data_ptr()), int(storage.nbytes())
            seen[address] = max(size, seen.get(address, 0))
    if len(devices) != 1:
        raise UnsupportedPDLayoutError(
            f"this rank's KV cache spans devices {sorted(map(str, devices))[:4]}; "
            "PdplanConnector registers one rank's cache on one device"
        )
    kind, index = devices.pop()
    if kind != buffer_device:
        raise UnsupportedPDLayoutError(
            f"the KV cache is in {kind} memory and kv_buffer_device is {buffer_device!r}: "
            f"PdplanConnector reads the cache where it lives (no staging buffers), so set "
            f"kv_buffer_device to {kind!r}"
        )
    return sorted(seen.items()), Memory.of_device(kind, index)

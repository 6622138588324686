"""vLLM's pipeline stages: each PP rank keeps only its stage's layers, but both sides plan with
the whole model's buffers (each naming its layer, the stage holding it following from the
layout). The ranks of one TP rank's PP group gather their stages' buffers at registration and
number them as one rank holding every layer would (``CacheBuffers``: every layer's KV in model
order, then every state), each rank keeping the addresses of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pdplan._arrays import CacheBuffers
from pdplan._core import UnsupportedPDLayoutError
from pdplan._exchange import decode_layout, encode_layout
from pdplan._model import BufferKind, ParallelLayout
from pdplan.session import WorkerCache


def layer_partition(num_layers: int, pp_size: int) -> tuple[int, ...]:
    """Each stage's model layers, as vLLM deals them (``get_pp_indices``, which reads
    ``VLLM_PP_LAYER_PARTITION``)."""
    from vllm.distributed.utils import get_pp_indices

    return tuple(
        end - start
        for start, end in (get_pp_indices(num_layers, stage, pp_size) for stage in range(pp_size))
    )


def side_layout(role: str, tp_size: int, pp_size: int, partition: tuple[int, ...]) -> Any:
    """One side's ranks: TP ranks of each pipeline stage."""
    return ParallelLayout(
        role,  # type: ignore[arg-type]
        tp_size * pp_size,
        pp_size=pp_size,
        pp_layer_partition=partition if pp_size > 1 else None,
    )


def whole_model(describe: Callable[[], WorkerCache], stage: int, group: Any) -> WorkerCache:
    """This rank's cache (``describe``'s) as the whole model's buffers: ``group``'s ranks (the
    stages of this TP rank, vLLM's PP group) gather their buffers, in stage order; each
    buffer's number is its place among every stage's (KV before state, then by layer), this
    rank's addresses kept and the others' zero (the planner reads a buffer only on the stage
    holding its layer). A stage whose cache is refused is refused on every stage, which would
    otherwise wait for it in the gather."""
    import torch.distributed as dist

    try:
        cache = describe()
        own = (stage, "", *encode_layout(ParallelLayout("prefill", 1), cache.cache.buffers),
               int(cache.identity.get("num_layers", 0)))  # fmt: skip
    except Exception as error:  # any: the other stages must hear of it, or wait forever
        why = str(error) if isinstance(error, UnsupportedPDLayoutError) else ""
        own = (stage, why or f"{type(error).__name__}: {error}", b"", b"", 0)
    gathered: list[Any] = [None] * int(group.world_size)
    dist.all_gather_object(gathered, own, group=group.cpu_group)
    refused = [(their_stage, why) for their_stage, why, *_ in sorted(gathered) if why]
    if refused:
        their_stage, why = refused[0]
        raise UnsupportedPDLayoutError(f"pipeline stage {their_stage}: {why}")
    everyone = []
    layers_with_cache = 0
    for their_stage, _, version, payload, layers in sorted(gathered):
        for local, buffer in enumerate(decode_layout(version, payload).buffers):
            if buffer.layer is None:
                raise UnsupportedPDLayoutError(
                    f"a buffer of pipeline stage {their_stage} names no model layer; stages "
                    "are planned by their layers"
                )
            state = buffer.buffer_kind is BufferKind.MAMBA_STATE
            everyone.append(((state, buffer.layer, their_stage, local), buffer))
        layers_with_cache += int(layers)
    everyone.sort(key=lambda item: item[0])
    stages_of: dict[int, set[int]] = {}
    for (_, layer, their_stage, _), _ in everyone:
        stages_of.setdefault(layer, set()).add(their_stage)
    if any(len(stages) > 1 for stages in stages_of.values()):
        raise UnsupportedPDLayoutError(
            "two pipeline stages keep caches of one model layer; PdplanConnector reads stages "
            "holding consecutive layers, each once"
        )
    number_of = {(key[2], key[3]): index for index, (key, _) in enumerate(everyone)}
    buffers = tuple(replace(b, buffer_index=i) for i, (_, b) in enumerate(everyone))
    bases, limits = [0] * len(buffers), [0] * len(buffers)
    for local, (base, limit) in enumerate(zip(cache.cache.base_ptrs, cache.cache.limits)):
        bases[number_of[(stage, local)]], limits[number_of[(stage, local)]] = base, limit
    groups = tuple(
        replace(g, buffers=tuple(number_of[(stage, i)] for i in g.buffers)) for g in cache.groups
    )
    whole = CacheBuffers(buffers, tuple(bases), tuple(limits), cache.cache.shared)
    identity = {**cache.identity, "num_layers": layers_with_cache}
    return replace(cache, cache=whole, groups=groups, identity=identity)

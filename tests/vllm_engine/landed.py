"""The bytes a decode worker holds for a request the moment its KV has landed, before any
forward pass reads them: both connectors' ``get_transfer_results`` wrapped alike, each
request's blocks (as the step's metadata named them) copied out of every layer of the worker's
own cache. Installed in each worker process when ``$PDPLAN_LANDED`` names a folder; each
worker writes ``<pid>.pkl`` there, a dict by request id of ``block_bytes``' result.

The oracle of byte-for-byte checks: what the prefill side holds for the same tokens
(``block_bytes`` on its workers) against what landed here."""

from __future__ import annotations

import os
import pickle
from typing import Any

ENV = "PDPLAN_LANDED"


def block_bytes(vllm_config: Any, kv_cache_config: Any, groups: Any) -> dict[str, list[Any]]:
    """Per layer name, a copy (numpy, bytes) of each of its group's blocks ``groups[g]`` in
    every tensor of the layer (a recurrent layer's states one after another), in block order."""
    layers = vllm_config.compilation_config.static_forward_context
    out: dict[str, list[Any]] = {}
    for number, group in enumerate(kv_cache_config.kv_cache_groups):
        blocks = list(groups[number]) if number < len(groups) else []
        for name in group.layer_names:
            cache = layers[name].kv_cache
            tensors = cache if isinstance(cache, (list, tuple)) else [cache]
            spec = group.kv_cache_spec
            # A state's slot is one page whatever its group's block.
            block_size = 0 if type(spec).__name__ == "MambaSpec" else int(spec.block_size)
            out[name] = [[_block(t, b, block_size) for t in tensors] for b in blocks]
    return out


def _block(tensor: Any, block: int, block_size: int) -> Any:
    """Block ``block``'s bytes of one tensor: its kernel pages where the tensor's pages hold
    fewer tokens than the scheduler's block (an MLA latent's ``[pages, tokens, width]``, the
    CPU attention's ``[pages, heads, tokens, 2 * head_size]``), joined along the tokens."""
    import torch

    if not block_size or tensor.dim() not in (3, 4):
        return tensor[block].contiguous().view(torch.uint8).numpy().copy()
    axis = 1 if tensor.dim() == 3 else 2
    ratio = max(1, block_size // int(tensor.shape[axis]))
    pages = [tensor[block * ratio + i] for i in range(ratio)]
    joined = torch.cat(pages, dim=axis - 1) if ratio > 1 else pages[0]
    return joined.contiguous().view(torch.uint8).numpy().copy()


def _local_blocks(metadata: Any) -> dict[str, Any]:
    """Each request's blocks to fill, per group, on either connector."""
    if hasattr(metadata, "reqs_to_recv"):  # NixlConnector
        found = {}
        for request_id, meta in metadata.reqs_to_recv.items():
            ids = meta.local_block_ids
            found[request_id] = ids if ids and isinstance(ids[0], (list, tuple)) else [ids]
        return found
    return {
        r.request_id: r.local_blocks for r in getattr(metadata, "receives", ()) if r.local_blocks
    }


def _wrap(cls: Any, folder: str) -> None:
    start_load_kv, get_transfer_results = cls.start_load_kv, cls.get_transfer_results
    asked: dict[str, Any] = {}
    path = os.path.join(folder, f"{os.getpid()}.pkl")

    def start(self: Any, forward_context: Any, **kwargs: Any) -> None:
        asked.update(_local_blocks(self._get_connector_metadata()))
        start_load_kv(self, forward_context, **kwargs)

    def results(self: Any, finished_req_ids: set[str]) -> Any:
        out = get_transfer_results(self, finished_req_ids)
        landed = {
            r: block_bytes(self._vllm_config, self._kv_cache_config, asked.pop(r))
            for r in out.finished_recving
            if r in asked
        }
        if landed:
            held = {}
            if os.path.exists(path):
                with open(path, "rb") as f:
                    held = pickle.load(f)
            held.update(landed)
            with open(path, "wb") as f:
                pickle.dump(held, f)
        return out

    cls.start_load_kv, cls.get_transfer_results = start, results


def install() -> None:
    """Wraps both connectors' hooks when ``$PDPLAN_LANDED`` names a folder."""
    folder = os.environ.get(ENV)
    if not folder:
        return
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector

    from pdplan.connectors.vllm import PdplanConnector

    for cls in (NixlConnector, PdplanConnector):
        _wrap(cls, folder)


def read(folder: str) -> list[dict[str, Any]]:
    """What each worker wrote, by worker (in pid order), and forgets it."""
    found = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".pkl"):
            with open(os.path.join(folder, name), "rb") as f:
                found.append(pickle.load(f))
            os.remove(os.path.join(folder, name))
    return found

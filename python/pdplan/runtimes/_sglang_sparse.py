"""SGLang's ``MiniMaxSparseKVPool`` unwrapped (``memory_pool.py``): its ``main_pool`` holds every
local layer's K and V (an ``MHATokenToKVPool``), and its sparse layers' index keys sit in
``index_kv_pool`` (index K and V, one head a rank) or ``index_k_pool`` (index K only), each
local index ``i`` being the layer its ``index_kv_layer_id_mapping`` /
``index_k_layer_id_mapping`` maps to ``i``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pdplan._core import UnsupportedPDLayoutError
from pdplan.runtimes._states import attribute

#: ``(model layer, what, arrays)`` of one per-layer tensor group of a pool.
Tensors = list[tuple[int, str, Any]]


def is_sparse_pool(pool: Any) -> bool:
    """Whether ``pool`` is a ``MiniMaxSparseKVPool`` (a wrapper with a ``main_pool``)."""
    return hasattr(pool, "main_pool")


def sparse_pool_tensors(pool: Any, main: Callable[[Any], Tensors]) -> Tensors:
    """The main pool's tensors (read by ``main``) and the index caches, by model layer: an
    ``index_kv`` entry holds ``(K, V)``, an ``index_k`` entry K alone."""
    name = type(pool).__name__
    if getattr(pool, "dense_pool", None) is not None:
        raise UnsupportedPDLayoutError(
            f"{name}.dense_pool (HiSparse's dense-layer pool) is not described yet; the main "
            "pool alone would move without it"
        )
    found = main(attribute(pool, "main_pool", name))
    for attr, mapping_attr, what in (
        ("index_kv_pool", "index_kv_layer_id_mapping", "index_kv"),
        ("index_k_pool", "index_k_layer_id_mapping", "index_k"),
    ):
        sub = getattr(pool, attr, None)
        if sub is None:
            continue
        layers = _layers(attribute(pool, mapping_attr, name), f"{name}.{mapping_attr}")
        keys = list(attribute(sub, "k_buffer", f"{name}.{attr}"))
        values = list(attribute(sub, "v_buffer", f"{name}.{attr}")) if what == "index_kv" else []
        if len(keys) != len(layers) or (values and len(values) != len(keys)):
            raise UnsupportedPDLayoutError(
                f"{name}.{attr} holds {len(keys)} K and {len(values)} V buffers, but "
                f"{mapping_attr} names {len(layers)} layers"
            )
        for i, layer in enumerate(layers):
            found.append((layer, what, (keys[i], values[i]) if values else (keys[i],)))
    return found


def _layers(mapping: Mapping[int, int], what: str) -> list[int]:
    """The model layer of each local index ``0..n`` of a ``{layer: index}`` mapping."""
    by_index = {int(index): int(layer) for layer, index in mapping.items()}
    if sorted(by_index) != list(range(len(by_index))):
        raise UnsupportedPDLayoutError(
            f"{what} maps layers to {sorted(by_index)}, not to 0..{len(by_index) - 1}"
        )
    return [by_index[i] for i in range(len(by_index))]

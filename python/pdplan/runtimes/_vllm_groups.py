"""The KV cache groups vLLM's hybrid allocator makes, read from the ``kv_cache_config`` it hands
a connector: each group's kind, its scheduler block and its layers (duck-typed: vLLM is not
imported). Read by spec class name, exactly: a spec pdplan does not know (a subclass included)
is refused naming it, never read as its parent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pdplan._core import UnsupportedPDLayoutError

#: vLLM's null block: the block pool's first block, id 0, stands for a block a group no longer
#: keeps (``BlockPool.null_block`` in ``v1/core/block_pool.py``).
NULL_BLOCK = 0

#: Tokens at a prompt's end the prefill side leaves to the decode side where a group keeps
#: less than every token: the decode side recomputes the last prompt token (vLLM does so after
#: every load), so each group must still hold what that token reads. A state must stand before
#: it (h(N-1), from which the decode side derives h(N) itself), as NixlConnector's
#: ``_prefill_backoff`` does; a window or a chunk must keep the tokens it attends to, which a
#: prefill side that computed the last token too has freed (a window's oldest once its start
#: falls on a block boundary; at a chunk boundary, the whole chunk: the decode side would then
#: attend to null blocks, silently).
BACKOFF = 1

#: vLLM's spec classes by the kind of blocks a group keeps (``pdplan.session._block_pairs``'
#: ``GroupKind``). MLA is full attention over a latent; a sliding-window MLA group keeps a
#: window like any other.
_KINDS: dict[str, Literal["attention", "window", "state"]] = {
    "FullAttentionSpec": "attention",
    "MLAAttentionSpec": "attention",
    "SlidingWindowSpec": "window",
    "SlidingWindowMLASpec": "window",
    "ChunkedLocalAttentionSpec": "window",
    "MambaSpec": "state",
}


@dataclass(frozen=True)
class CacheGroup:
    """One KV cache group: what its blocks keep, its scheduler block (tokens), its layers by
    vLLM's names, the window or chunk its attention keeps (tokens), and a state group's
    speculative scratch slots after its state."""

    kind: Literal["attention", "window", "state"]
    spec: str
    block_size: int
    layers: tuple[str, ...]
    window: int | None = None
    scratch_blocks: int = 0

    def identity(self) -> list[Any]:
        """What the two sides' groups must agree on (their layers are checked as buffers);
        not the block size: the sides may differ in it (the session states it apart)."""
        return [self.spec, self.window, self.scratch_blocks]


def _spec_of(group: Any) -> Any:
    spec = group.kv_cache_spec
    if type(spec).__name__ == "UniformTypeKVCacheSpecs":
        # Layers of one type with their own sizes (heads, head dims): one kind.
        specs = list(spec.kv_cache_specs.values())
        kinds = {type(s).__name__ for s in specs}
        if len(kinds) != 1:
            raise UnsupportedPDLayoutError(
                f"a KV cache group mixes specs {sorted(kinds)}; PdplanConnector reads a "
                "group of one kind"
            )
        return specs[0]
    return spec


def _group(group: Any) -> CacheGroup:
    spec = _spec_of(group)
    name = type(spec).__name__
    kind = _KINDS.get(name)
    if kind is None:
        raise UnsupportedPDLayoutError(
            f"a KV cache group of {name} (layers {list(group.layer_names)[:4]}) is one "
            f"PdplanConnector does not read; it reads {', '.join(sorted(_KINDS))}. Serve the "
            "model with NixlConnector, or ask for this kind"
        )
    window = getattr(spec, "sliding_window", None) or getattr(spec, "attention_chunk_size", None)
    return CacheGroup(
        kind=kind,
        spec=name,
        block_size=int(spec.block_size),
        layers=tuple(str(n) for n in group.layer_names),
        window=None if window is None else int(window),
        scratch_blocks=int(getattr(spec, "num_speculative_blocks", 0) or 0),
    )


def cache_groups(kv_cache_config: Any) -> tuple[CacheGroup, ...]:
    """The groups that take part in KV transfer, in vLLM's order (the order of a request's
    block id lists), or a refusal naming a group pdplan does not read."""
    groups = getattr(kv_cache_config, "transfer_groups", None)
    if groups is None:
        groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if not groups:
        raise UnsupportedPDLayoutError(
            "vLLM passed the connector no KV cache groups (kv_cache_config); PdplanConnector "
            "needs vLLM 0.32's hybrid allocator config"
        )
    return tuple(_group(g) for g in groups)


def transfer_block_ids(kv_cache_config: Any, block_ids: Any) -> Any:
    """A request's block ids of the groups that take part in transfer (vLLM lists every
    group's; a group that is rebuilt after a load, not moved, is left out)."""
    select = getattr(kv_cache_config, "select_transfer_block_ids", None)
    if select is None or not isinstance(block_ids, (list, tuple)):
        return block_ids
    if not block_ids or not isinstance(block_ids[0], (list, tuple)):
        return block_ids
    return select(block_ids)


def first_needed(group: CacheGroup, prompt: int, first_block: int) -> int:
    """The first token a decode request of ``prompt`` tokens needs of ``group``, whose first
    block to fill starts at token ``first_block`` (past its prefix hit): that block's first
    for full attention; for a sliding window, the oldest token the prompt's last token attends
    to (vLLM's ``SlidingWindowManager`` keeps tokens from ``computed - window + 1``, and the
    decode side computes the last prompt token, at ``prompt - 1``); for chunked local
    attention, the last token's chunk; never before the first block to fill."""
    if group.kind == "window" and group.window:
        if group.spec == "ChunkedLocalAttentionSpec":
            kept = (prompt - 1) // group.window * group.window
        else:
            kept = prompt - group.window
        return max(kept, first_block)
    return first_block


def backoff(groups: tuple[CacheGroup, ...]) -> int:
    """Prompt tokens the prefill side leaves to the decode side (``BACKOFF`` with a group of
    state, a window or a chunk, else 0): the two sides compute it from the same groups."""
    return BACKOFF if any(g.kind in ("state", "window") for g in groups) else 0

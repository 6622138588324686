"""Buffers from a runtime's own cache arrays: the shape and strides of each tensor decide its
``BufferLayout`` (src/array_layout.rs), so nothing is computed by hand."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pdplan import _core
from pdplan._bounded import bounded_tuple, shown
from pdplan._core import UnsupportedPDLayoutError
from pdplan._model import BufferKind, BufferLayout

if TYPE_CHECKING:
    from pdplan._layouts import ModelLayer

__all__ = ["CacheBuffers", "StateSpec", "buffer_from_array", "page_parts", "state_specs"]


def buffer_from_array(
    buffer_index: int,
    buffer_kind: BufferKind | str,
    array: Any,
    axes: Sequence[str],
    *,
    logical_size: int | None = None,
    tp_size: int = 1,
    page_size: int | None = None,
    layer: int | None = None,
    sliding_window: int | None = None,
    attention_chunk_size: int | None = None,
    logical_parts: Sequence[int] | None = None,
    logical_part_groups: Sequence[int] | None = None,
) -> tuple[BufferLayout, int, int]:
    """The ``BufferLayout`` one cache array holds, its base address and its limit (the bytes
    from the base its own view reaches), ready for ``PDTransferPlanner`` and
    ``PreparedTransfer``.

    Nothing is copied, torch is not imported, and the memory (which may sit on a GPU) is never
    read. The strides decide the rest: head-major or token-major pages, the page stride (a
    view of K in a fused K/V page keeps the fused page as its stride and owns ``page_bytes``
    of it), the rows. A KV array without a head axis is replicated (MLA). A layout pdplan
    cannot express is refused naming the axis: a page axis that is not outermost, padded,
    overlapping, flipped or broadcast strides, a dtype of unknown size.

    :param buffer_index: The buffer's number (``BufferLayout.buffer_index``).
    :param buffer_kind: What it holds (a ``BufferKind`` or its string value).
    :param array: The rank's cache array: anything with ``__cuda_array_interface__``,
        ``__array_interface__`` or ``__dlpack__`` (torch, CuPy, numpy).
    :param axes: A name for each dimension:

        - ``"page"``: pages (vLLM's blocks, a state's request slots), the outermost axis;
        - ``"slot"``: a flat token pool (SGLang), with ``page_size=``: a page is ``page_size``
          consecutive slots;
        - ``"token"``: tokens within a page; ``"row"``: a state's rows that are not split (a
          conv state's kernel taps stored outside its channels);
        - ``"head"`` (or ``"unit"``, ``"channel"``): the axis split over TP ranks;
        - ``"plane"``: K and V of one fused token-major page (one buffer of two planes);
        - ``"dim"`` (or ``"byte"``): the inner elements of one unit, innermost last.
    :param logical_size: The whole model's units across TP ranks (KV heads, state channels),
        not the rank's; TP above the KV heads gives replica groups.
    :param tp_size: The side's TP size.
    :param page_size: Tokens a page, with a ``"slot"`` axis (a page is ``page_size``
        consecutive slots).
    :param layer: The model layer (``BufferLayout.layer``).
    :param sliding_window: A sliding-window layer's window (``BufferLayout.sliding_window``).
    :param attention_chunk_size: A chunked local-attention layer's chunk
        (``BufferLayout.attention_chunk_size``).
    :param logical_parts: The split axis's parts (``BufferLayout.logical_parts``).
    :param logical_part_groups: Each part's groups (``BufferLayout.logical_part_groups``): a
        part of fewer groups than TP shards is held whole by each shard of its group.
    """
    layout, base, limit = _core.buffer_from_array(
        buffer_index,
        buffer_kind,
        array,
        axes,
        logical_size=logical_size,
        tp_size=tp_size,
        page_size=page_size,
        layer=layer,
        sliding_window=sliding_window,
        attention_chunk_size=attention_chunk_size,
        logical_parts=logical_parts,
        logical_part_groups=logical_part_groups,
    )
    return layout, base, limit


@dataclass(frozen=True)
class StateSpec:
    """What one state tensor of a recurrent layer does not say itself: its channels (or
    heads) across all TP ranks, and the parts they concatenate (Mamba2's conv ``x | B | C``,
    each split over TP on its own)."""

    logical_size: int
    """The tensor's channels (or heads) across all TP ranks."""
    logical_parts: tuple[int, ...] | None = None
    """The parts the channels concatenate, each split over TP on its own; None: one part."""
    part_groups: tuple[int, ...] | None = None
    """Each part's groups (``BufferLayout.logical_part_groups``: Mamba2's B and C in
    ``n_groups`` groups, copied onto the ranks of their heads where TP exceeds them); None: the
    parts split evenly."""


def state_specs(
    layer: ModelLayer, dtype: str = "bfloat16", *, fused_conv: bool = False
) -> tuple[StateSpec, ...]:
    """The state tensors of one recurrent layer (``Mamba2Layer``, ``GatedDeltaNetLayer``, ...),
    as the model code derives them, in the order runtimes keep them: the conv states first,
    then the recurrent state (vLLM's per-layer list, SGLang's ``mamba_cache``). A layer that
    caches no state is refused.

    :param layer: The layer.
    :param dtype: The model's dtype (as ``ModelShape.dtype``); the channel counts do not
        depend on it.
    :param fused_conv: The runtime keeps the layer's conv states as one tensor, their channels
        one after another (vLLM's and SGLang's Kimi Delta Attention: ``q | k | v``): one spec
        whose parts are the conv states, each split over TP on its own.
    """
    from pdplan._layouts import ModelShape, model_buffer_layouts

    shape = ModelShape(layer_kinds=(layer,), dtype=dtype)
    prefill, _ = model_buffer_layouts(shape, 1, 1)
    states = tuple(
        StateSpec(b.logical_size, b.logical_parts, b.logical_part_groups)
        for b in prefill
        if not b.is_token_indexed
    )
    if not states:
        raise UnsupportedPDLayoutError(f"{shown(layer)} caches no state; it has no state specs")
    # The model code lists the recurrent state first (where the layer has one).
    convs, recurrent = states[1:], states[:1]
    if fused_conv and len(convs) > 1:
        parts = tuple(
            size for spec in convs for size in (spec.logical_parts or (spec.logical_size,))
        )
        convs = (StateSpec(sum(parts), parts),)
    return convs + recurrent


@dataclass(frozen=True)
class CacheBuffers:
    """One rank's cache as pdplan sees it: ``buffers`` (numbered ``0..n`` in order),
    ``base_ptrs`` and ``limits`` indexed by ``buffer_index``. Numbering is the same on every
    runtime, so any two sides pair: K and V of the ``k``-th layer that keeps a KV cache are
    ``2k`` and ``2k + 1`` (an MLA layer's one buffer is ``k``), and state tensors follow all
    of them, layer by layer, conv first."""

    buffers: tuple[BufferLayout, ...]
    """The rank's buffers, ``buffer_index`` ``0..n`` in order."""
    base_ptrs: tuple[int, ...]
    """Each buffer's base address."""
    limits: tuple[int, ...]
    """How many bytes from each base the buffer's own view reaches."""
    shared: tuple[tuple[str, str], ...] = ()
    """Layers that keep no cache of their own but read another's (vLLM's KV sharing, Gemma 3n
    and 4): ``(layer, the layer whose buffers it shares)`` by the runtime's names. Their bytes
    are described once, as the buffers of the layer they share; nothing moves for them."""

    @classmethod
    def of(
        cls,
        entries: Iterable[tuple[BufferLayout, int, int]],
        shared: Iterable[tuple[str, str]] = (),
    ) -> CacheBuffers:
        """The cache of ``buffer_from_array``'s results, taken apart into the three columns;
        buffers not numbered ``0..n`` in order are refused.

        :param entries: ``(layout, base, limit)`` of each buffer, in order.
        :param shared: ``(layer, the layer whose buffers it shares)`` of each layer that keeps
            no cache of its own.
        """
        built = bounded_tuple(entries, "entries", "MAX_LAYOUT_BUFFERS")
        for position, (buffer, _, _) in enumerate(built):
            if buffer.buffer_index != position:  # the runtimes' adapters number in order
                raise UnsupportedPDLayoutError(
                    f"buffer {position} has buffer_index {buffer.buffer_index}; number the "
                    "buffers 0..n in order"
                )
        return cls(
            tuple(b for b, _, _ in built),
            tuple(base for _, base, _ in built),
            tuple(limit for _, _, limit in built),
            bounded_tuple(shared, "shared", "MAX_LAYERS"),
        )


def page_parts(array: Any, page_size: int, widths: Sequence[int]) -> list[Any]:
    """The parts of a page made of parts of different widths, as views of ``array`` (nothing
    copied): a page of ``page_size`` tokens holding every token's first part, then every
    token's second, and so on (vLLM's and SGLang's MLA indexer caches: ``page_size`` x 128
    fp8 keys, then ``page_size`` fp32 scales). Part ``i`` is ``(pages, page_size,
    widths[i])``, each page's bytes of it at its offset in the page, so ``buffer_from_array``
    describes it with the whole page as its stride, as it does K of a fused K/V page: slot
    maps and page ids then move each token's bytes of every part exactly, at any page sizes.

    :param array: The cache, pages outermost, ``page_size * sum(widths)`` elements a page
        (``(pages, page_size, sum(widths))`` or ``(pages, page_size * sum(widths))``).
    :param page_size: Tokens a page holds.
    :param widths: Elements a token has in each part, in the page's order.
    """
    widths = bounded_tuple(widths, "widths", "MAX_PARTS")
    numbers = (page_size, *widths)
    if any(isinstance(n, bool) or not isinstance(n, int) for n in numbers):
        raise UnsupportedPDLayoutError(
            f"page_size and widths must be ints, got {[type(n).__name__ for n in numbers]}"
        )
    if page_size <= 0 or not widths or any(w <= 0 for w in widths):
        raise UnsupportedPDLayoutError(
            f"page parts need a positive page_size and positive widths, got page_size="
            f"{page_size}, widths={list(widths)}"
        )
    shape = tuple(int(n) for n in getattr(array, "shape", ()))
    per_page = page_size * sum(widths)
    if not shape or math.prod(shape[1:]) != per_page:
        raise UnsupportedPDLayoutError(
            f"an array of shape {shape} does not hold pages of {page_size} tokens x "
            f"{sum(widths)} elements ({per_page} a page) with its pages outermost"
        )
    flat = array.reshape(shape[0], per_page)
    views, start = [], 0
    for width in widths:
        views.append(flat[:, start : start + page_size * width].reshape(shape[0], page_size, width))
        start += page_size * width
    return views

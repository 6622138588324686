"""Streams' progress: what a prefill rank has made final of a stream, and what a decode rank
reads of it next (each layer's tokens once, once final). The protocol carries it
(``protocol.encode_progress``); a runtime's scheduler says it (vLLM: its ``StreamTracker``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    """A prefill request that streams, after one step: its blocks so far (per KV cache group)
    and how many of its tokens are final once the step's forward pass is done; while a step
    runs, ``ahead``: the tokens final once it is done and the model layers whose forward pass
    has already made them final (vLLM's ``save_kv_layer``)."""

    request_id: str
    blocks: tuple[tuple[int, ...], ...]
    final_tokens: int
    final_length: int
    ahead: tuple[int, tuple[int, ...]] | None = None


#: A slice to read: its model layers (None: all), and its tokens ``[start, stop)``.
Slice = tuple[tuple[int, ...] | None, int, int]


def next_slices(
    read_to: int, ahead: dict[int, int], notice: Progress, layers: tuple[int, ...] | None
) -> tuple[list[Slice], int, dict[int, int]]:
    """What a decode rank reads of a stream on ``notice``, and its marks after: every layer's
    tokens from where its reads stopped (``read_to``, or further for layers in ``ahead``) to
    ``final_tokens``, then the layers the running step has saved (``notice.ahead``) to the
    step's end. Layers read ahead need ``layers``, every model layer the rank's buffers hold
    (None: whole steps only). Each (layer, token) is read once."""
    out: list[Slice] = []
    ahead = dict(ahead)
    final = notice.final_tokens
    if final > read_to:
        if not ahead:
            out.append((None, read_to, final))
        else:
            assert layers is not None  # a layer was read ahead, so layers are known
            out += _grouped(layers, lambda layer: ahead.get(layer, read_to), final)
        read_to = final
        ahead = {layer: t for layer, t in ahead.items() if t > final}
    if notice.ahead is not None and layers is not None:
        stop, saved = notice.ahead
        chosen = [layer for layer in saved if layer in layers]
        more = _grouped(chosen, lambda layer: max(read_to, ahead.get(layer, 0)), stop)
        for group, _, _ in more:
            ahead.update(dict.fromkeys(group or (), stop))
        out += more
    return out, read_to, ahead


def _grouped(layers: Iterable[int], start_of: Callable[[int], int], stop: int) -> list[Slice]:
    """``layers`` grouped by where their reads start, each group's slice up to ``stop``; empty
    ones left out (a state layer's slice that ends the prompt must move once)."""
    starts: dict[int, list[int]] = {}
    for layer in layers:
        starts.setdefault(start_of(layer), []).append(layer)
    return [(tuple(group), start, stop) for start, group in sorted(starts.items()) if start < stop]

"""Streams' progress, the engine-independent parts: what a prefill rank says of the streams it
has run (one JSON object a reply, read strictly: it comes from a peer), and how a scheduler's
steps become progress (blocks handed out chunk by chunk, tokens final after each step)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pdplan._core import UnsupportedPDLayoutError
from pdplan.connectors._transfer_params import block_groups


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


#: The longest progress reply read, and the most streams one request asks for (a reply names
#: every block of each: 64 streams of 32k blocks stay under the side channel's 4 MiB).
MAX_REPLY_BYTES = 4 << 20
MAX_STREAMS_ASKED = 64
#: Layers one progress entry names ahead at most (pdplan's bound on a model's layers).
MAX_AHEAD_LAYERS = 4096


def _ahead_of(given: Any, final_tokens: int, final_length: int) -> tuple[int, tuple[int, ...]]:
    """A progress entry's ``[tokens, [layers]]`` read strictly."""
    bad = UnsupportedPDLayoutError(
        "a progress entry's ahead is not [tokens, layers] with final <= tokens <= length"
    )
    if not isinstance(given, list) or len(given) != 2 or not isinstance(given[1], list):
        raise bad
    tokens, layers = given
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        raise bad
    if not final_tokens <= tokens <= final_length or len(layers) > MAX_AHEAD_LAYERS:
        raise bad
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in layers):
        raise bad
    return tokens, tuple(sorted(set(layers)))


def notices_of(reply: list[bytes]) -> dict[str, Progress]:
    """A progress reply read strictly (it comes from a peer): the streams the rank has run."""
    if len(reply) != 1 or len(reply[0]) > MAX_REPLY_BYTES:
        raise UnsupportedPDLayoutError("a progress reply is not one JSON object")
    try:
        given = json.loads(reply[0])
    except (ValueError, RecursionError):
        raise UnsupportedPDLayoutError("a progress reply does not parse") from None
    if not isinstance(given, dict) or len(given) > MAX_STREAMS_ASKED:
        raise UnsupportedPDLayoutError("a progress reply is not one object of streams")
    out = {}
    for stream_id, entry in given.items():
        if not isinstance(entry, list) or len(entry) not in (4, 5) or not isinstance(entry[0], str):
            raise UnsupportedPDLayoutError(
                "a progress entry is not request, blocks, tokens, length (and ahead)"
            )
        blocks = block_groups(entry[1], "a progress reply's blocks")
        final_tokens, final_length = entry[2], entry[3]
        if (
            any(isinstance(v, bool) or not isinstance(v, int) for v in (final_tokens, final_length))
            or not 0 <= final_tokens <= final_length
        ):
            raise UnsupportedPDLayoutError("a progress entry's tokens are not 0 <= final <= length")
        ahead = _ahead_of(entry[4], final_tokens, final_length) if len(entry) == 5 else None
        out[str(stream_id)[:256]] = Progress(
            entry[0][:256], blocks, final_tokens, final_length, ahead
        )
    return out


def encode_progress(known: dict[str, Progress]) -> bytes:
    """The reply a prefill rank gives for the streams it has run."""
    out: dict[str, list[Any]] = {}
    for stream_id, p in known.items():
        entry: list[Any] = [p.request_id, [list(g) for g in p.blocks], p.final_tokens]
        entry.append(p.final_length)
        if p.ahead is not None:
            entry.append([p.ahead[0], list(p.ahead[1])])
        out[stream_id] = entry
    return json.dumps(out).encode()


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


class StreamTracker:
    """The prefill requests that stream, followed through a scheduler's steps: vLLM hands a
    request's blocks out chunk by chunk (a new request's whole lists, a running one's
    additions, a resumed one's lists anew)."""

    def __init__(self) -> None:
        # request id -> (stream id, blocks per group, prompt length)
        self._streams: dict[str, tuple[str, list[list[int]], int]] = {}

    def add(self, request_id: str, stream_id: str, blocks: Any, length: int) -> None:
        self._streams[request_id] = (stream_id, [list(g) for g in blocks], length)

    def drop(self, request_id: str) -> bool:
        """Forgets a request; whether it streamed."""
        return self._streams.pop(request_id, None) is not None

    def step(self, output: Any) -> dict[str, Progress]:
        """Each stream the step runs: its blocks so far and the tokens final once the step's
        forward pass is done, by stream id."""
        if output is None or not self._streams:
            return {}
        scheduled = getattr(output, "num_scheduled_tokens", None) or {}
        computed: dict[str, int] = {}
        for new in getattr(output, "scheduled_new_reqs", None) or ():
            if new.req_id in self._streams:
                self._streams[new.req_id][1][:] = [list(g) for g in new.block_ids]
                computed[new.req_id] = int(new.num_computed_tokens)
        cached = getattr(output, "scheduled_cached_reqs", None)
        if cached is not None:
            resumed: set[str] = set(getattr(cached, "resumed_req_ids", None) or ())
            for i, req_id in enumerate(cached.req_ids):
                if req_id not in self._streams:
                    continue
                groups = self._streams[req_id][1]
                added = cached.new_block_ids[i]
                if added is not None:
                    if req_id in resumed:
                        groups[:] = [list(g) for g in added]
                    else:
                        for group, more in zip(groups, added):
                            group.extend(more)
                computed[req_id] = int(cached.num_computed_tokens[i])
        out = {}
        for req_id, done in computed.items():
            stream_id, groups, length = self._streams[req_id]
            final = min(length, done + int(scheduled.get(req_id, 0)))
            out[stream_id] = Progress(req_id, tuple(tuple(g) for g in groups), final, length)
        return out

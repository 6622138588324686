"""Streams' progress, the engine-independent parts: what a prefill rank says of the streams it
has run (one JSON object a reply, read strictly: it comes from a peer), and how a scheduler's
steps become progress (blocks handed out chunk by chunk, tokens final after each step)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pdplan._core import UnsupportedPDLayoutError
from pdplan.connectors._transfer_params import block_groups


@dataclass(frozen=True)
class Progress:
    """A prefill request that streams, after one step: its blocks so far (per KV cache group)
    and how many of its tokens are final once the step's forward pass is done."""

    request_id: str
    blocks: tuple[tuple[int, ...], ...]
    final_tokens: int
    final_length: int


#: The longest progress reply read, and the most streams one request asks for (a reply names
#: every block of each: 64 streams of 32k blocks stay under the side channel's 4 MiB).
MAX_REPLY_BYTES = 4 << 20
MAX_STREAMS_ASKED = 64


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
        if not isinstance(entry, list) or len(entry) != 4 or not isinstance(entry[0], str):
            raise UnsupportedPDLayoutError(
                "a progress entry is not request, blocks, tokens, length"
            )
        blocks = block_groups(entry[1], "a progress reply's blocks")
        final_tokens, final_length = entry[2], entry[3]
        if (
            any(isinstance(v, bool) or not isinstance(v, int) for v in (final_tokens, final_length))
            or not 0 <= final_tokens <= final_length
        ):
            raise UnsupportedPDLayoutError("a progress entry's tokens are not 0 <= final <= length")
        out[str(stream_id)[:256]] = Progress(entry[0][:256], blocks, final_tokens, final_length)
    return out


def encode_progress(known: dict[str, Progress]) -> bytes:
    """The reply a prefill rank gives for the streams it has run."""
    return json.dumps(
        {
            stream_id: [p.request_id, [list(g) for g in p.blocks], p.final_tokens, p.final_length]
            for stream_id, p in known.items()
        }
    ).encode()


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

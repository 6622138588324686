"""A prefill instance's streams followed through vLLM's scheduler output: vLLM hands a
request's blocks out chunk by chunk (a new request's whole lists, a running one's additions, a
resumed one's lists anew), and each step makes its scheduled tokens final."""

from __future__ import annotations

from typing import Any

from pdplan.session._progress import Progress


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

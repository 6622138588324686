"""A decode rank following streams: a request whose prefill still runs is read slice by slice,
the tokens each prefill step makes final, as the prefill ranks' progress notices say (pull with
progress notices: the decode side's blocks are allocated when its request arrives, the prefill
side's as its chunks are scheduled, so the decode side asks and reads). Slices are pdplan's
(``descriptors(..., tokens=, final_length=, decode_prefix=)``): each byte once, once final."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from pdplan._core import UnsupportedPDLayoutError
from pdplan._staging import CostModel
from pdplan.connectors._progress import (
    MAX_STREAMS_ASKED,
    Progress,
    Slice,
    next_slices,
    notices_of,
)
from pdplan.connectors._reads import Reads
from pdplan.connectors._side_channel import ask
from pdplan.connectors.vllm._caches import GroupCache
from pdplan.connectors.vllm._metadata import Receive
from pdplan.connectors.vllm._peers import Peer


@dataclass
class Following:
    """One streamed request this rank reads: how far its reads have gone, and those in
    flight."""

    receive: Receive
    peer: Peer
    sources: list[int]
    read_to: int
    deadline: float
    prefill_request: str | None = None
    handles: list[Any] = field(default_factory=list)
    #: Its request ended (aborted): no more reads; released once those in flight land.
    cancelled: bool = False
    #: Model layers read past ``read_to`` (their step's layers saved ahead), to which token.
    ahead: dict[int, int] = field(default_factory=dict)

    @property
    def stream(self) -> Any:
        assert self.receive.stream is not None
        return self.receive.stream

    def finished_receive(self) -> Receive:
        """The request, naming the prefill side's own request id (its "done" notice)."""
        remote = self.receive.remote
        assert remote is not None and self.prefill_request is not None
        return replace(self.receive, remote=replace(remote, request_id=self.prefill_request))

    def slices(self, notice: Progress, layers: tuple[int, ...] | None) -> list[Slice]:
        """What to read of ``notice`` (``next_slices``), the marks moved as if read."""
        slices, self.read_to, self.ahead = next_slices(self.read_to, self.ahead, notice, layers)
        return slices


def progress(
    followings: list[Following], timeout: float, skip: set[tuple[str, int]]
) -> tuple[dict[str, Progress], set[tuple[str, int]]]:
    """Each stream's progress on every source rank it reads, one request a rank for all of
    them (in batches a reply can hold): the least of its ranks' (a token is final once every
    rank holding its bytes has run it). A stream some rank has not run yet, or whose rank did
    not answer, is left out; so are ranks in ``skip``. Returns the ranks that did not answer
    too (``(host, port)``)."""
    asked: dict[tuple[str, int], list[Following]] = {}
    for following in followings:
        peer = following.peer
        for rank in following.sources:
            asked.setdefault((peer.host, peer.port + rank), []).append(following)
    least: dict[str, Progress] = {}
    missing: set[str] = set()
    failed: set[tuple[str, int]] = set()
    for (host, port), group in asked.items():
        if (host, port) in skip:
            missing.update(f.stream.stream_id for f in group)
            continue
        for start in range(0, len(group), MAX_STREAMS_ASKED):
            part = group[start : start + MAX_STREAMS_ASKED]
            names = "\n".join(f.stream.stream_id for f in part).encode()
            try:
                found = notices_of(ask(host, port, [b"progress", names], timeout))
            except UnsupportedPDLayoutError:  # PeerGone too: only this rank's streams wait
                failed.add((host, port))
                missing.update(f.stream.stream_id for f in group)
                break
            for following in part:
                stream_id = following.stream.stream_id
                notice = found.get(stream_id)
                if notice is None:
                    missing.add(stream_id)
                elif stream_id not in least or notice.final_tokens < least[stream_id].final_tokens:
                    least[stream_id] = notice
    return {k: v for k, v in least.items() if k not in missing}, failed


def slice_reads(
    following: Following,
    notice: Progress,
    prepared_of: Any,
    groups: tuple[GroupCache, ...],
    slices: list[Slice],
    form: tuple[bool, CostModel | None],
) -> list[tuple[int, Reads]]:
    """Each source rank's reads of ``slices`` of the stream, in ``form`` (strided where the
    engine takes them, and the cost model that weighs them: ``Reads``' arguments)."""
    stream = following.stream
    receive = following.receive
    if len(notice.blocks) != len(receive.local_blocks):
        raise UnsupportedPDLayoutError(
            f"request {receive.request_id}: the prefill side streams {len(notice.blocks)} KV "
            f"cache groups for {len(receive.local_blocks)} here"
        )
    out = []
    for rank in following.sources:
        prepared = prepared_of(rank)
        reads = Reads(*form)
        for group, theirs, ours in zip(groups, notice.blocks, receive.local_blocks):
            pages = group.rules.pages
            request = prepared.request(pages(theirs), pages(ours))  # read once a step
            for layers, start, stop in slices:
                reads.add(
                    request, buffers=group.buffers, layers=layers, tokens=range(start, stop),
                    final_length=stream.final_length, decode_prefix=stream.decode_prefix,
                )  # fmt: skip
        out.append((rank, reads))
    return out

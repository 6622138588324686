"""The scheduler side: which requests pull from a prefill instance, which hold their blocks
for a decode instance, and the ``kv_transfer_params`` both speak (vLLM's NixlConnector
protocol: a proxy or router that drives NixlConnector drives this one unchanged)."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from pdplan._core import UnsupportedPDLayoutError
from pdplan.connectors.vllm._metadata import StepMetadata
from pdplan.connectors.vllm._ranks import Ranks
from pdplan.connectors.vllm._stream_tracker import StreamTracker
from pdplan.connectors.vllm._transfer_params import (
    REMOTE_KEYS,
    Pull,
    prefill_params,
    pull_of,
    remote_block_groups,
    stream_of,
)
from pdplan.runtimes._vllm_groups import (
    NULL_BLOCK,
    backoff,
    cache_groups,
    first_needed,
    transfer_block_ids,
)
from pdplan.session import Receive, Remote, Settings, Stream
from pdplan.session._block_pairs import kept_blocks

logger = logging.getLogger("vllm.pdplan")  # under vLLM's handlers

#: Marks a prefill request whose prompt has lost its last tokens already (a preempted request
#: is scheduled again): NixlConnector's key, so either connector truncates once.
TRUNCATED_KEY = "_p_side_truncated"


@functools.cache
def _completed() -> tuple[Any, ...]:
    """The states of a request that ran to its end (vLLM's, imported once vLLM runs)."""
    from vllm.v1.request import RequestStatus

    return (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED)


def _check_groups(sent: tuple[Any, ...], here: tuple[Any, ...]) -> None:
    """Refuses a request whose prefill side sent blocks of another number of groups."""
    if len(sent) != len(here):
        raise UnsupportedPDLayoutError(
            f"the prefill side sent blocks of {len(sent)} KV cache groups for {len(here)} here"
        )


class SchedulerSide:
    """One instance's scheduler-side state."""

    def __init__(
        self, engine_id: str, settings: Settings, ranks: Ranks, port: int, kv_cache_config: Any
    ) -> None:
        self.engine_id = engine_id
        self.settings = settings
        self.ranks = ranks
        self.port = port  # this DP rank's rank 0's side channel
        self.kv_cache_config = kv_cache_config
        self.groups = groups = cache_groups(kv_cache_config)
        # Prompt tokens the prefill side leaves for the decode side to compute.
        self.backoff = backoff(groups)
        # Every group of the cache moves and keeps every token's block: a request's blocks to
        # fill are those vLLM did not find cached, each group's first at the hit's end.
        every = getattr(kv_cache_config, "kv_cache_groups", None)
        self._plain = (
            every is not None
            and len(every) == len(groups)
            and all(g.kind == "attention" for g in groups)
        )
        # How many times the workers registered the cache (``registered``): a decode side
        # that met an older registration handshakes anew.
        self.generation = 0
        self._receives: list[Receive] = []
        self._leases: dict[str, float] = {}
        # Decode requests that joined the queue this step, and queued ones that ended.
        self._held: dict[str, Remote] = {}
        self._unheld: list[str] = []
        self._holding: set[str] = set()
        self._streams = StreamTracker()
        # Decode requests that stream: the tokens their local prefix hit covers, those being
        # read, and those that ended before their last slice landed.
        self._hits: dict[str, int] = {}
        self._following: set[str] = set()
        self._cancelled: list[str] = []
        # Decode requests that pull, their params read once (``_pull``) until they are read.
        self._pulls: dict[str, Pull] = {}

    def new_request(self, request: Any) -> None:
        """A decode request that pulls joins the queue: its prefill ranks are asked to hold
        its blocks while it waits (``_hold``). A prefill request for a decode side, of a model
        with state, windows or chunks: its prompt loses its last ``backoff`` tokens, which the
        decode side computes (the state it reads then stands before them, and every token a
        window or chunk reads is kept), as NixlConnector's ``_truncate_request_for_prefill``
        does for state."""
        params = request.kv_transfer_params
        self._hold(request)
        if (
            not self.backoff
            or not params
            or not params.get("do_remote_decode")
            or params.get(TRUNCATED_KEY)
            or request.num_prompt_tokens <= self.backoff
            or request.prompt_token_ids is None
        ):
            return
        del request.prompt_token_ids[-self.backoff :]
        del request._all_token_ids[-self.backoff :]
        request.num_prompt_tokens -= self.backoff
        request.max_tokens = 1
        params[TRUNCATED_KEY] = True

    def _hold(self, request: Any) -> None:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            return
        try:
            pull = self._pull(request)
        except UnsupportedPDLayoutError:
            return  # refused where it is matched
        if pull.stream_id is None:  # a stream's prefill side still runs it
            self._held[request.request_id] = pull.remote

    def _pull(self, request: Any) -> Pull:
        """A decode request's params, read strictly the first time they are asked for (when
        it arrives): the scheduler asks again every step it tries to schedule the request."""
        pull = self._pulls.get(request.request_id)
        if pull is None:
            pull = self._pulls[request.request_id] = pull_of(request.kv_transfer_params)
        return pull

    def _leaves_queue(self, request_id: str) -> None:
        """A queued decode request computed here after all: no hold for it anymore."""
        if self._held.pop(request_id, None) is None:
            self._unheld.append(request_id)

    def matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params
        if params and params.get("do_remote_prefill"):
            try:
                pull = self._pull(request)
            except UnsupportedPDLayoutError as error:
                logger.error("pdplan: request %s is computed here: %s", request.request_id, error)
                params["do_remote_prefill"] = False
                self._leaves_queue(request.request_id)
                return 0, False
            count = self._loaded_end(request, pull.num_tokens) - num_computed_tokens
            if count > 0:
                if pull.stream_id is not None:
                    self._hits[request.request_id] = num_computed_tokens
                return count, True
        return 0, False

    def _loaded_end(self, request: Any, held: int) -> int:
        """The token a decode request's load ends at: its prompt less what the prefill side
        leaves to this side, and never past the ``held`` tokens the prefill side holds
        (``remote_num_tokens``, 0 where not said): a proxy may hand this side the prompt and the
        first token, whose KV no prefill block holds (this side computes it)."""
        prompt = len(request.prompt_token_ids or ())
        end = prompt - (self.backoff if prompt > self.backoff else 0)
        return min(end, held) if held else end

    def after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        if params and params.get("do_remote_decode") and params.get("stream_id") is not None:
            self._stream_prefill(request, blocks)
            return
        if not params or not params.get("do_remote_prefill"):
            return
        if params.get("stream_id") is not None:
            self._stream_decode(request, blocks, num_external_tokens)
            return
        params["do_remote_prefill"] = False
        if num_external_tokens == 0 and params.keys().isdisjoint(REMOTE_KEYS):
            return
        pull = self._pulls.pop(request.request_id, None)
        if self._plain and num_external_tokens > 0:
            self._plain_receive(request, blocks, pull)
            return
        local: tuple[tuple[int, ...], ...] = ()
        listed: tuple[int, ...] = ()
        if num_external_tokens > 0:
            # The blocks to fill: past the local prefix hit, a state group's state slot
            # (vLLM leaves a window's null blocks out of them); how many blocks each group
            # lists in all, to place them.
            unhashed = blocks.get_unhashed_block_ids_all_groups()
            local = tuple(tuple(g) for g in self._transfer_ids(unhashed))
            listed = tuple(map(len, self._transfer_ids(blocks.get_block_ids())))
        try:
            pull = pull or pull_of(params)
            remote, groups, num_tokens = pull.remote, pull.blocks, pull.num_tokens
            if local:
                local = self._kept(local)
                _check_groups(groups, local)
        except UnsupportedPDLayoutError as error:
            # The request waits for its blocks: the worker reports them to recompute.
            self._receives.append(Receive(request.request_id, local, (), None, str(error)))
            return
        tokens = self._positions(request, num_tokens, listed, local) if local else ()
        self._receives.append(Receive(request.request_id, local, groups, remote,
                                      local_tokens=tokens, num_tokens=num_tokens))  # fmt: skip

    def _plain_receive(self, request: Any, blocks: Any, pull: Pull | None) -> None:
        """``after_alloc`` of a request read into a cache whose groups all keep every token's
        block (``_plain``): the blocks to fill are those vLLM found no cached copy of, each
        group's first at the hit's end (the general way's answer without its per-group work:
        this runs a request on the scheduling thread)."""
        local = tuple(map(tuple, blocks.get_unhashed_block_ids_all_groups()))
        try:
            pull = pull or pull_of(request.kv_transfer_params)
            _check_groups(pull.blocks, local)
        except UnsupportedPDLayoutError as error:
            # The request waits for its blocks: the worker reports them to recompute.
            self._receives.append(Receive(request.request_id, local, (), None, str(error)))
            return
        tokens = tuple(
            ((len(every) - len(mine)) * group.block_size,) * 2
            for group, every, mine in zip(self.groups, blocks.blocks, local)
        )
        self._receives.append(Receive(request.request_id, local, pull.blocks, pull.remote, "",
                                      None, tokens, pull.num_tokens))  # fmt: skip

    def _positions(
        self,
        request: Any,
        held: int,
        listed: tuple[int, ...],
        kept: tuple[tuple[int, ...], ...],
    ) -> tuple[tuple[int, int], ...]:
        """Each group's ``(token its first block to fill starts at, first token needed)``:
        the blocks to fill are the tail of the group's list of ``listed`` blocks (after its
        prefix hit and a window's null blocks), which covers the request's tokens from the
        first, a block a position. The session pairs groups whose blocks hold other token
        counts on the two sides by these."""
        # The decode side computes from the load's end on: a window's first needed token is
        # the oldest that token attends to.
        computed_from = self._loaded_end(request, held)
        out = []
        for group, every, mine in zip(self.groups, listed, kept):
            first = (every - len(mine)) * group.block_size
            out.append((first, first_needed(group, computed_from + 1, first)))
        return tuple(out)

    def _transfer_ids(self, block_ids: Any) -> Any:
        """A request's block ids of the groups that move (``transfer_block_ids``)."""
        return transfer_block_ids(self.kv_cache_config, block_ids)

    def _kept(self, block_ids: Any) -> tuple[tuple[int, ...], ...]:
        """Each group's blocks that hold the request's bytes (``kept_blocks``)."""
        if len(block_ids) != len(self.groups):
            raise UnsupportedPDLayoutError(
                f"a request lists blocks of {len(block_ids)} KV cache groups; this instance "
                f"has {len(self.groups)}"
            )
        return tuple(
            kept_blocks(ids, g.kind, NULL_BLOCK, g.scratch_blocks)
            for ids, g in zip(block_ids, self.groups)
        )

    def _sent_blocks(self, block_ids: Any) -> tuple[tuple[int, ...], ...]:
        """Each group's blocks a finished prefill request sends, of vLLM's ``block_ids`` (a
        list a group): every block where each group keeps every token's (no null block among
        them), else each group's kept blocks."""
        if (
            self._plain
            and type(block_ids) is tuple
            and len(block_ids) == len(self.groups)
            and all(type(g) is list and NULL_BLOCK not in g for g in block_ids)
        ):
            return tuple(map(tuple, block_ids))
        return self._kept(self._transfer_ids(remote_block_groups(block_ids, "block_ids")))

    def _stream_prefill(self, request: Any, blocks: Any) -> None:
        """A prefill request whose decode side reads it while it runs: its progress goes to
        the workers each step (``step``)."""
        try:
            stream_id = stream_of(request.kv_transfer_params)
        except UnsupportedPDLayoutError as error:
            logger.error("pdplan: request %s does not stream: %s", request.request_id, error)
            return
        assert stream_id is not None  # after_alloc checked the key
        length = len(request.prompt_token_ids or ())
        self._streams.add(request.request_id, stream_id, blocks.get_block_ids(), length)

    def _stream_decode(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """A decode request that reads a prefill request while it runs: every block it has
        (its prefix hit included: slices skip those tokens), the stream to follow."""
        params = request.kv_transfer_params
        params["do_remote_prefill"] = False
        local = tuple(tuple(g) for g in blocks.get_block_ids()) if num_external_tokens else ()
        try:
            remote = (self._pulls.pop(request.request_id, None) or pull_of(params)).remote
        except UnsupportedPDLayoutError as error:
            self._receives.append(Receive(request.request_id, local, (), None, str(error)))
            return
        prompt = len(request.prompt_token_ids or ())
        # The prefill side streams the prompt less what it leaves to this side.
        length = prompt - (self.backoff if prompt > self.backoff else 0)
        hit = self._hits.pop(request.request_id, 0)
        stream = Stream(remote.request_id, hit, length)
        self._receives.append(Receive(request.request_id, local, (), remote, stream=stream))
        if local:
            self._following.add(request.request_id)

    def finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        params = request.kv_transfer_params
        pull = self._pulls.pop(request.request_id, None)
        streamed = self._streams.drop(request.request_id)
        self._hits.pop(request.request_id, None)
        if request.request_id in self._following:
            # Ended while its slices are read (aborted): the workers stop, and release its
            # blocks once the reads in flight have landed.
            self._following.discard(request.request_id)
            self._cancelled.append(request.request_id)
            self._holding.add(request.request_id)
            return True, None
        if not params:
            return False, None
        if params.get("do_remote_prefill"):
            # Aborted before its blocks were allocated: tell the prefill side to free.
            params["do_remote_prefill"] = False
            try:
                pull = pull or pull_of(params)
            except UnsupportedPDLayoutError:
                pull = None
            if pull is None or pull.stream_id is not None:
                # Nothing can be told to it; a stream names no prefill request to free.
                self._leaves_queue(request.request_id)
            else:
                self._receives.append(Receive(request.request_id, (), (), pull.remote))
            return False, None
        if not params.get("do_remote_decode"):
            return False, None
        try:
            groups = self._sent_blocks(block_ids)
        except UnsupportedPDLayoutError as error:  # never fails the engine: nothing is sent
            logger.error("pdplan: request %s is not sent: %s", request.request_id, error)
            return False, None
        completed = request.status in _completed()
        if not any(groups) or not (completed or streamed):
            return False, None
        # Held until every reader is done or the lease ends; a streamed request even when it
        # did not complete: its blocks were advertised while it ran.
        self._leases[request.request_id] = self.settings.kv_lease_seconds
        self._holding.add(request.request_id)
        if not completed:
            return True, None
        here = Remote(self.engine_id, request.request_id, self.settings.side_channel_host,
                      self.port, self.ranks.tp_size, self.generation,
                      self.ranks.pp_size)  # fmt: skip
        # For proxies and routers: a wall-clock time the lease lasts at least (a decode side's
        # holds renew it; the prefill rank counts it on its own clock).
        expiry = time.time() + self.settings.kv_lease_seconds
        return True, prefill_params(here, groups, int(request.num_computed_tokens), expiry)

    def registered(self, generations: list[int]) -> None:
        """The workers' registration generations, as their handshake metadata tells."""
        if generations:
            self.generation = max(self.generation, *generations)

    def step(self, scheduler_output: Any = None) -> StepMetadata:
        progress = self._streams.step(scheduler_output)
        meta = StepMetadata(self._receives, self._leases, progress, self._cancelled,
                            self._held, self._unheld)  # fmt: skip
        self._receives, self._leases, self._cancelled = [], {}, []
        self._held, self._unheld = {}, []
        return meta

    def freed(self, request_ids: set[str], received: set[str] | None = None) -> None:
        self._holding -= request_ids
        self._following -= received or set()

    @property
    def holding(self) -> bool:
        return bool(self._holding)

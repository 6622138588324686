"""A decode request's ``kv_transfer_params`` as the prefill side wrote them, read strictly:
they come from a client (through a proxy), so every value is checked and bounded before the
connector acts on it, and a bad one is refused naming the key."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from pdplan._core import UnsupportedPDLayoutError
from pdplan.limits import MAX_TOKENS, MAX_WORLD_SIZE
from pdplan.session._requests import Remote, block_groups

#: Keys a decode request's ``kv_transfer_params`` must carry to pull.
REMOTE_KEYS = ("remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host",
               "remote_port")  # fmt: skip

#: Longest string value read.
MAX_TEXT = 256
#: A control character: never in a value sent on (a tab or newline would split a line).
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _text(params: Mapping[str, Any], key: str) -> str:
    value = params.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT or _CONTROL.search(value):
        raise UnsupportedPDLayoutError(
            f"kv_transfer_params {key} must be a string of 1 to {MAX_TEXT} characters, none a "
            "control character"
        )
    return value


def _int(params: Mapping[str, Any], key: str, low: int, high: int, default: int | None) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UnsupportedPDLayoutError(
            f"kv_transfer_params {key} must be an integer in [{low}, {high}]"
        )
    return value


#: NixlConnector's request protocol as vLLM 0.32 to 0.34 speak it (its versions 14 to 16): a
#: proxy copies the prefill side's params into the decode request verbatim. Version 15 (vLLM
#: 0.33) added the registration generation; 16 (0.34) changed NIXL's handshake only. A
#: request without the generation (a 0.32 prefill side) reads as generation 0.
GENERATION_KEY = "remote_registration_generation"
#: The highest registration generation read.
MAX_GENERATION = (1 << 31) - 1
#: What this connector transfers by: the decode side pulls (NixlConnector's ``pull`` mode).
TRANSFER_MODE = "pull"


def _remote(params: Mapping[str, Any], request_id: str) -> Remote:
    # A prefill instance's ranks are TP ranks, or TP ranks of each pipeline stage; decode
    # context parallelism (its ranks holding shares of a request's tokens) it does not run.
    if _int(params, "dcp_size", 1, MAX_WORLD_SIZE, 1) != 1:
        raise UnsupportedPDLayoutError(
            f"kv_transfer_params dcp_size={params.get('dcp_size')}: PdplanConnector reads "
            "prefill instances without decode context parallelism (dcp_size 1)"
        )
    tp_size = _int(params, "tp_size", 1, MAX_WORLD_SIZE, 1)
    pp_size = _int(params, "pp_size", 1, MAX_WORLD_SIZE // tp_size, 1)
    return Remote(
        engine_id=_text(params, "remote_engine_id"),
        request_id=request_id,
        host=_text(params, "remote_host"),
        port=_int(params, "remote_port", 1, 65535, None),
        tp_size=tp_size,
        generation=_int(params, GENERATION_KEY, 0, MAX_GENERATION, 0),
        pp_size=pp_size,
    )


def remote_tokens_of(params: Mapping[str, Any]) -> int:
    """The tokens the prefill side holds of a request (``remote_num_tokens``; 0 where a
    sender leaves it out): where its blocks sit, for groups whose blocks hold other token
    counts on the two sides."""
    return _int(params, "remote_num_tokens", 0, MAX_TOKENS, 0)


def remote_of(params: Mapping[str, Any]) -> Remote:
    """The prefill instance and request a decode request reads from."""
    return _remote(params, _text(params, "remote_request_id"))


def prefill_params(
    remote: Remote, blocks: tuple[tuple[int, ...], ...], num_tokens: int, expires_at: float
) -> dict[str, Any]:
    """What a prefill request that finished returns for its decode request: every key a
    NixlConnector of vLLM 0.32 to 0.34 returns, so proxies and routers that read them (a
    request's tokens, its blocks' expiry) find them."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [list(g) for g in blocks],
        "remote_engine_id": remote.engine_id,
        "remote_request_id": remote.request_id,
        "remote_host": remote.host,
        "remote_port": remote.port,
        "tp_size": remote.tp_size,
        "dcp_size": 1,
        "pp_size": remote.pp_size,
        "remote_num_tokens": num_tokens,
        "remote_blocks_expiry_time": expires_at,
        GENERATION_KEY: remote.generation,
        "transfer_mode": TRANSFER_MODE,
    }


#: What a streamed request names instead of the prefill side's request and blocks: a stream
#: id the proxy gives both requests (the decode side learns the rest from progress notices).
STREAM_KEY = "stream_id"


def stream_of(params: Mapping[str, Any]) -> str | None:
    """The stream id of a request that streams (its ``kv_transfer_params`` name one), else
    None."""
    if params.get(STREAM_KEY) is None:
        return None
    return _text(params, STREAM_KEY)  # one line: no control character


def streamed_remote_of(params: Mapping[str, Any]) -> Remote:
    """The prefill instance a streamed decode request reads from; its request id is the
    stream's until the first progress notice names the prefill side's own."""
    stream_id = stream_of(params)
    assert stream_id is not None  # a streamed request names one
    return _remote(params, stream_id)


def remote_block_groups(
    block_ids: Any, key: str = "remote_block_ids"
) -> tuple[tuple[int, ...], ...]:
    """Block ids of ``kv_transfer_params`` per KV cache group, read strictly."""
    return block_groups(block_ids, f"kv_transfer_params {key}")


class Pull(NamedTuple):
    """What a decode request's ``kv_transfer_params`` say, read once when it arrives: the
    prefill instance and request, its blocks per group and tokens (none for a stream, whose
    progress notices tell them), and the stream it follows, if any."""

    remote: Remote
    blocks: tuple[tuple[int, ...], ...]
    num_tokens: int
    stream_id: str | None = None


def pull_of(params: Mapping[str, Any]) -> Pull:
    """A decode request's params read strictly, or a refusal naming the key. Read once a
    request on vLLM's scheduling thread: params every sender writes (exact ints and strings in
    range) take the short way; any other goes the key-by-key way, which refuses with reasons."""
    get = params.get
    if get(STREAM_KEY) is None:
        engine, request, host = (
            get("remote_engine_id"),
            get("remote_request_id"),
            get("remote_host"),
        )
        port, tokens = get("remote_port"), get("remote_num_tokens", 0)
        tp, pp, dcp = get("tp_size", 1), get("pp_size", 1), get("dcp_size", 1)
        generation = get(GENERATION_KEY, 0)
        if (
            type(engine) is str
            and type(request) is str
            and type(host) is str
            and 0 < len(engine) <= MAX_TEXT
            and 0 < len(request) <= MAX_TEXT
            and 0 < len(host) <= MAX_TEXT
            and not _CONTROL.search(engine + request + host)
            and type(port) is int
            and 0 < port <= 65535
            and type(tp) is int
            and type(pp) is int
            and 0 < tp
            and 0 < pp
            and tp * pp <= MAX_WORLD_SIZE
            and type(dcp) is int
            and dcp == 1
            and type(generation) is int
            and 0 <= generation <= MAX_GENERATION
            and type(tokens) is int
            and 0 <= tokens <= MAX_TOKENS
        ):
            blocks = remote_block_groups(get("remote_block_ids"))
            return Pull(Remote(engine, request, host, port, tp, generation, pp), blocks, tokens)
    return strict_pull_of(params)


def strict_pull_of(params: Mapping[str, Any]) -> Pull:
    """``pull_of`` key by key: each value checked alone, a refusal naming the first bad one."""
    stream_id = stream_of(params)
    if stream_id is not None:
        try:
            tokens = remote_tokens_of(params)
        except UnsupportedPDLayoutError:
            tokens = 0  # a stream's length comes from its progress notices
        return Pull(_remote(params, stream_id), (), tokens, stream_id)
    blocks = remote_block_groups(params.get("remote_block_ids"))
    return Pull(remote_of(params), blocks, remote_tokens_of(params))

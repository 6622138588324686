"""A decode request's ``kv_transfer_params`` as the prefill side wrote them, read strictly:
they come from a client (through a proxy), so every value is checked and bounded before the
connector acts on it, and a bad one is refused naming the key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pdplan._core import UnsupportedPDLayoutError
from pdplan.limits import MAX_WORLD_SIZE

#: Keys a decode request's ``kv_transfer_params`` must carry to pull.
REMOTE_KEYS = ("remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host",
               "remote_port")  # fmt: skip

#: Longest string value read, KV cache groups and blocks a group at most.
MAX_TEXT = 256
MAX_GROUPS = 64
MAX_BLOCKS = 1 << 22


@dataclass(frozen=True)
class Remote:
    """Where a decode request's KV is: the prefill instance and its request."""

    engine_id: str
    request_id: str
    host: str
    port: int
    tp_size: int


def _text(params: Mapping[str, Any], key: str) -> str:
    value = params.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT:
        raise UnsupportedPDLayoutError(
            f"kv_transfer_params {key} must be a string of 1 to {MAX_TEXT} characters"
        )
    return value


def _int(params: Mapping[str, Any], key: str, low: int, high: int, default: int | None) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UnsupportedPDLayoutError(
            f"kv_transfer_params {key} must be an integer in [{low}, {high}]"
        )
    return value


def remote_of(params: Mapping[str, Any]) -> Remote:
    """The prefill instance and request a decode request reads from."""
    return Remote(
        engine_id=_text(params, "remote_engine_id"),
        request_id=_text(params, "remote_request_id"),
        host=_text(params, "remote_host"),
        port=_int(params, "remote_port", 1, 65535, None),
        tp_size=_int(params, "tp_size", 1, MAX_WORLD_SIZE, 1),
    )


#: What a streamed request names instead of the prefill side's request and blocks: a stream
#: id the proxy gives both requests (the decode side learns the rest from progress notices).
STREAM_KEY = "stream_id"


def stream_of(params: Mapping[str, Any]) -> str | None:
    """The stream id of a request that streams (its ``kv_transfer_params`` name one), else
    None."""
    if params.get(STREAM_KEY) is None:
        return None
    stream_id = _text(params, STREAM_KEY)
    if "\n" in stream_id:
        raise UnsupportedPDLayoutError(f"kv_transfer_params {STREAM_KEY} must be one line")
    return stream_id


def streamed_remote_of(params: Mapping[str, Any]) -> Remote:
    """The prefill instance a streamed decode request reads from; its request id is the
    stream's until the first progress notice names the prefill side's own."""
    stream_id = stream_of(params)
    assert stream_id is not None  # a streamed request names one
    return Remote(
        engine_id=_text(params, "remote_engine_id"),
        request_id=stream_id,
        host=_text(params, "remote_host"),
        port=_int(params, "remote_port", 1, 65535, None),
        tp_size=_int(params, "tp_size", 1, MAX_WORLD_SIZE, 1),
    )


def block_groups(block_ids: Any, key: str = "remote_block_ids") -> tuple[tuple[int, ...], ...]:
    """Block ids per KV cache group, whether given as one list or one per group."""
    if not isinstance(block_ids, (list, tuple)):
        raise UnsupportedPDLayoutError(f"kv_transfer_params {key} must be a list")
    if not block_ids:
        return ()
    groups = [block_ids] if not isinstance(block_ids[0], (list, tuple)) else list(block_ids)
    if len(groups) > MAX_GROUPS:
        raise UnsupportedPDLayoutError(f"{key} holds over {MAX_GROUPS} KV cache groups")
    out = []
    for group in groups:
        if not isinstance(group, (list, tuple)) or len(group) > MAX_BLOCKS:
            raise UnsupportedPDLayoutError(f"{key} must hold lists of at most {MAX_BLOCKS} ids")
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in group):
            raise UnsupportedPDLayoutError(f"{key} must hold non-negative integers")
        out.append(tuple(group))
    return tuple(out)

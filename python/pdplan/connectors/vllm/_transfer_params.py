"""A decode request's ``kv_transfer_params`` as the prefill side wrote them, read strictly:
they come from a client (through a proxy), so every value is checked and bounded before the
connector acts on it, and a bad one is refused naming the key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdplan._core import UnsupportedPDLayoutError
from pdplan.limits import MAX_WORLD_SIZE
from pdplan.session._requests import Remote, block_groups

#: Keys a decode request's ``kv_transfer_params`` must carry to pull.
REMOTE_KEYS = ("remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host",
               "remote_port")  # fmt: skip

#: Longest string value read.
MAX_TEXT = 256


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


def remote_block_groups(
    block_ids: Any, key: str = "remote_block_ids"
) -> tuple[tuple[int, ...], ...]:
    """Block ids of ``kv_transfer_params`` per KV cache group, read strictly."""
    return block_groups(block_ids, f"kv_transfer_params {key}")

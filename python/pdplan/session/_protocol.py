"""The side channel's protocol, defined once: its version, its verbs, the frames of each
message and the bounds every message is read within. Both sides build and read messages only
here; every reader treats the bytes as a peer's (bounded first, then parsed strictly), and a
message that is not the protocol is a ``ProtocolFault``.

A request is ``[PROTOCOL, verb, ...]``; a reply ``[OK, ...]`` or ``[REFUSED, reason]``.

- ``hello``: ``identity, layout version, layout payload`` -> ``identity, layout version,
  layout payload (with base addresses), engine metadata, planner fingerprint``.
- ``done``: one line a request, ``request_id<TAB>decode ranks the prefill rank waits for``.
- ``progress``: one stream id a line -> one JSON object (``encode_progress``).
- ``hold``: one request id a line -> one line a request, ``request_id<TAB>state``: the
  milliseconds the rank holds its blocks from now on (the ask renews the lease), ``freed``
  (they went free: the lease ran out, or every reader was done) or ``unknown`` (no lease has
  reached the rank yet)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdplan._bounded import shown
from pdplan._core import UnsupportedPDLayoutError
from pdplan._exchange import decode_layout
from pdplan.limits import DEFAULT_MAX_LAYOUT_BYTES, MAX_TOKENS
from pdplan.session._faults import (
    LayoutRefused,
    ProtocolFault,
    VersionSkew,
    cause_of,
    fault_of,
)
from pdplan.session._memory import untagged
from pdplan.session._progress import Progress
from pdplan.session._requests import block_groups

#: The protocol's first frame: a peer speaking another version is refused by it. Version 2:
#: a handshake reply names the rank's registration generation, and its engine metadata the
#: memory it registered. Version 3: each side's identity states its KV cache groups' block
#: sizes (``BLOCK_SIZES``), which may differ from the peer's. Version 4: ``hold`` (leases
#: renewed and confirmed by the decode side).
PROTOCOL = b"pdplan-side/4"
HELLO, DONE, PROGRESS, HOLD = b"hello", b"done", b"progress", b"hold"
OK, REFUSED = b"ok", b"refused"

#: Frames a message carries at most, and bytes it may take (a layout frame of a large model
#: is well below a MiB; pdplan.limits bounds the layout itself).
MAX_FRAMES = 8
MAX_MESSAGE_BYTES = 4 << 20
#: The longest refusal reason sent or read, identity, and request or stream id.
MAX_REASON_BYTES = 4096
MAX_IDENTITY_BYTES = 4096
MAX_ID_CHARS = 256
#: Requests one "done" message names at most, and streams one progress request asks for (a
#: reply names every block of each: 64 streams of 32k blocks stay under 4 MiB).
MAX_NOTICES_A_MESSAGE = 1024
MAX_STREAMS_ASKED = 64
#: Layers one progress entry names ahead at most (pdplan's bound on a model's layers).
MAX_AHEAD_LAYERS = 4096


# -- replies ---------------------------------------------------------------------------------


def refusal(error: BaseException) -> list[bytes]:
    """A reply refusing a request: its reason, bounded, and its cause (``faults``)."""
    reason = str(error).encode(errors="replace")[:MAX_REASON_BYTES]
    return [REFUSED, reason, cause_of(error).encode()]


def reply_body(reply: list[bytes], where: str) -> list[bytes]:
    """A reply's frames after ``OK``; a refusal or a reply that is not the protocol raises."""
    if len(reply) > MAX_FRAMES + 1:
        raise ProtocolFault(f"the peer at {where} sent {len(reply)} frames")
    if reply[:1] == [OK]:
        return reply[1:]
    if reply[:1] == [REFUSED]:
        reason = reply[1][:MAX_REASON_BYTES].decode(errors="replace") if len(reply) > 1 else ""
        cause = reply[2][:32].decode(errors="replace") if len(reply) > 2 else ""
        raise fault_of(cause, f"the prefill rank at {where} refused: {reason or 'no reason'}")
    raise ProtocolFault(f"the peer at {where} does not answer in {PROTOCOL.decode()}")


def request_body(frames: list[bytes]) -> tuple[bytes, list[bytes]]:
    """A request's verb and its frames, or a ``ProtocolFault`` (any bytes may arrive)."""
    if not frames or frames[0] != PROTOCOL:
        raise VersionSkew(f"not a pdplan side-channel request (protocol {PROTOCOL.decode()})")
    if len(frames) < 2 or len(frames) > MAX_FRAMES:
        raise ProtocolFault(f"a side-channel request has 2 to {MAX_FRAMES} frames")
    return frames[1], frames[2:]


# -- hello ------------------------------------------------------------------------------------


#: The identity key each side states its KV cache groups' blocks under, ``[[block tokens,
#: page tokens], ...]`` a group (the scheduler's block, the cache tensor's page): read by the
#: peer, never compared with its own (pairs of other block sizes move tokens by slot maps).
BLOCK_SIZES = "block_sizes"
#: Pages a peer's block may split into at most (vLLM splits a block into kernel pages of 16
#: tokens and up: a hybrid model's attention blocks of a few thousand tokens are a few hundred
#: pages); it bounds the page ids a peer's block list expands to.
MAX_PAGES_A_BLOCK = 1 << 12


def identity_bytes(identity: dict[str, Any]) -> bytes:
    return json.dumps(identity, sort_keys=True).encode()


def block_sizes_of(peer_bytes: bytes, groups: int, peer_role: str) -> tuple[tuple[int, int], ...]:
    """The peer's ``(block tokens, page tokens)`` of each of its ``groups`` KV cache groups,
    from its identity (already checked by ``check_identity``), read strictly."""
    sizes = json.loads(peer_bytes).get(BLOCK_SIZES)
    if not isinstance(sizes, list) or len(sizes) != groups:
        raise ProtocolFault(f"the {peer_role} peer states no block sizes of its {groups} groups")
    out = []
    for entry in sizes:
        ok = isinstance(entry, list) and len(entry) == 2
        block, page = entry if ok else (0, 0)
        if not (
            ok
            and all(type(n) is int and 0 < n <= MAX_TOKENS for n in (block, page))
            and block % page == 0
            and block // page <= MAX_PAGES_A_BLOCK
        ):
            raise ProtocolFault(
                f"the {peer_role} peer's block sizes must be [block, page] pairs of at most "
                f"{MAX_TOKENS} tokens, the page dividing the block into at most "
                f"{MAX_PAGES_A_BLOCK} pages; got {shown(entry)}"
            )
        out.append((block, page))
    return tuple(out)


def check_identity(own: dict[str, Any], peer_bytes: bytes, peer_role: str) -> None:
    """Refuses a peer whose identity differs from ``own``, naming the first differing field."""
    if len(peer_bytes) > MAX_IDENTITY_BYTES:
        raise ProtocolFault(f"the {peer_role} peer's identity is over 4 KiB")
    try:
        peer = json.loads(peer_bytes)
    except (ValueError, RecursionError):
        raise ProtocolFault(f"the {peer_role} peer's identity is not JSON") from None
    if not isinstance(peer, dict):
        raise ProtocolFault(f"the {peer_role} peer's identity is not an object")
    for key in sorted((set(own) | set(peer)) - {BLOCK_SIZES}):
        if own.get(key) != peer.get(key):
            # Fields of our own are named as they are; one only the peer sends, bounded.
            field = key if key in own else shown(key)
            raise LayoutRefused(
                f"the {peer_role} instance differs in {field}: {shown(peer.get(key))} there, "
                f"{shown(own.get(key))} here; both instances must serve the same model the same "
                "way"
            )


def hello(identity: bytes, layout_frames: Sequence[bytes]) -> list[bytes]:
    """A decode rank's handshake request."""
    return [HELLO, identity, *layout_frames]


def hello_fields(body: list[bytes]) -> tuple[bytes, bytes, bytes]:
    """A handshake request's identity, layout version and layout payload."""
    if len(body) != 3:
        raise ProtocolFault("a hello is identity, layout version, layout payload")
    return body[0], body[1], body[2]


@dataclass(frozen=True)
class PrefillRankInfo:
    """What one prefill rank told in its handshake: its buffers' addresses, its engine's
    metadata (the memory it registered tagged ahead), and how many times it has registered
    its cache."""

    bases: tuple[int, ...]
    limits: tuple[int, ...]
    engine: bytes
    generation: int


#: Digits a registration generation takes at most.
MAX_GENERATION_DIGITS = 10


def generation_frame(generation: int) -> bytes:
    return str(generation).encode()


def generation_of(frame: bytes) -> int:
    """A registration generation, read strictly (ASCII digits, bounded)."""
    if not (0 < len(frame) <= MAX_GENERATION_DIGITS and frame.isdigit()):
        raise ProtocolFault(f"a registration generation is 1 to {MAX_GENERATION_DIGITS} digits")
    return int(frame)


def rank_info(frames: list[bytes]) -> PrefillRankInfo:
    """A handshake reply's addresses, engine metadata and registration generation
    (``identity, version, payload, engine, fingerprint, generation``), each checked here, so
    a bad one fails the handshake, never a read."""
    if len(frames) != 6:
        raise ProtocolFault(f"a handshake reply has {len(frames)} frames, not 6")
    layout = decode_layout(frames[1], frames[2], max_payload_bytes=DEFAULT_MAX_LAYOUT_BYTES)
    if layout.base_ptrs is None or layout.limits is None:
        raise ProtocolFault("the prefill rank sent no base addresses")
    untagged(frames[3])  # the memory it registered, named as the protocol says
    return PrefillRankInfo(tuple(layout.base_ptrs), tuple(layout.limits), frames[3],
                           generation_of(frames[5]))  # fmt: skip


# -- done -------------------------------------------------------------------------------------


def done_messages(lines: list[tuple[str, int]]) -> list[list[bytes]]:
    """ "done" messages for ``(request id, decode ranks waited for)``, as many as the bound
    on one message needs."""
    text = [f"{request_id}\t{count}" for request_id, count in lines]
    return [
        [DONE, "\n".join(text[start : start + MAX_NOTICES_A_MESSAGE]).encode()]
        for start in range(0, len(text), MAX_NOTICES_A_MESSAGE)
    ]


def done_lines(body: list[bytes]) -> list[tuple[str, int]]:
    """A "done" message's requests and counts, read strictly."""
    if len(body) != 1:
        raise ProtocolFault("a done message is one frame of lines")
    lines = body[0].split(b"\n", MAX_NOTICES_A_MESSAGE)
    if len(lines) > MAX_NOTICES_A_MESSAGE:
        raise ProtocolFault(f"a done message names more than {MAX_NOTICES_A_MESSAGE} requests")
    heard = []
    for line in lines:
        name, tab, expected = line.partition(b"\t")
        count = int(expected) if tab and expected.isdigit() and len(expected) <= 6 else -1
        if count < 0:
            raise ProtocolFault("a done line is not request_id<TAB>count")
        heard.append((name.decode(errors="replace")[:MAX_ID_CHARS], count))
    return heard


# -- progress ---------------------------------------------------------------------------------


def progress_request(stream_ids: list[str]) -> list[bytes]:
    return [PROGRESS, "\n".join(stream_ids).encode()]


def _asked_ids(body: list[bytes], what: str) -> list[str]:
    """The ids a request of one frame, an id a line, asks for (a progress or a hold)."""
    if len(body) != 1:
        raise ProtocolFault(f"a {what} request is one frame of ids")
    names = body[0].split(b"\n", MAX_NOTICES_A_MESSAGE)
    if len(names) > MAX_NOTICES_A_MESSAGE:
        raise ProtocolFault(f"a {what} request names over {MAX_NOTICES_A_MESSAGE} ids")
    return [n.decode(errors="replace")[:MAX_ID_CHARS] for n in names]


def progress_names(body: list[bytes]) -> list[str]:
    """The stream ids a progress request asks for."""
    return _asked_ids(body, "progress")


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


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ahead_of(given: Any, final_tokens: int, final_length: int) -> tuple[int, tuple[int, ...]]:
    """A progress entry's ``[tokens, [layers]]`` read strictly."""
    bad = ProtocolFault(
        "a progress entry's ahead is not [tokens, layers] with final <= tokens <= length"
    )
    if not isinstance(given, list) or len(given) != 2 or not isinstance(given[1], list):
        raise bad
    tokens, layers = given
    if not _int(tokens) or not final_tokens <= tokens <= final_length:
        raise bad
    if len(layers) > MAX_AHEAD_LAYERS or any(not _int(v) or v < 0 for v in layers):
        raise bad
    return tokens, tuple(sorted(set(layers)))


def notices_of(reply: list[bytes]) -> dict[str, Progress]:
    """A progress reply read strictly (it comes from a peer): the streams the rank has run."""
    if len(reply) != 1 or len(reply[0]) > MAX_MESSAGE_BYTES:
        raise ProtocolFault("a progress reply is not one JSON object")
    try:
        given = json.loads(reply[0])
    except (ValueError, RecursionError):
        raise ProtocolFault("a progress reply does not parse") from None
    if not isinstance(given, dict) or len(given) > MAX_STREAMS_ASKED:
        raise ProtocolFault("a progress reply is not one object of streams")
    out = {}
    for stream_id, entry in given.items():
        if not isinstance(entry, list) or len(entry) not in (4, 5) or not isinstance(entry[0], str):
            raise ProtocolFault(
                "a progress entry is not request, blocks, tokens, length (and ahead)"
            )
        try:
            blocks = block_groups(entry[1], "a progress reply's blocks")
        except UnsupportedPDLayoutError as error:
            raise ProtocolFault(str(error)) from None
        final_tokens, final_length = entry[2], entry[3]
        if not (_int(final_tokens) and _int(final_length) and 0 <= final_tokens <= final_length):
            raise ProtocolFault("a progress entry's tokens are not 0 <= final <= length")
        ahead = _ahead_of(entry[4], final_tokens, final_length) if len(entry) == 5 else None
        out[str(stream_id)[:MAX_ID_CHARS]] = Progress(
            entry[0][:MAX_ID_CHARS], blocks, final_tokens, final_length, ahead
        )
    return out


# -- hold -------------------------------------------------------------------------------------

#: A hold reply's states besides milliseconds held: the blocks went free, or no lease for the
#: request has reached the rank yet.
FREED, UNKNOWN = "freed", "unknown"
#: The longest hold a reply states (a day, in milliseconds), and its digits as sent.
MAX_HOLD_MS = 86_400_000
_MILLISECONDS = re.compile(rb"[0-9]{1,9}")


def hold_request(request_ids: list[str]) -> list[bytes]:
    return [HOLD, "\n".join(request_ids).encode()]


def hold_names(body: list[bytes]) -> list[str]:
    """The request ids a hold asks for."""
    return _asked_ids(body, "hold")


def encode_holds(states: dict[str, int | str]) -> list[bytes]:
    """A hold reply: each request's milliseconds held (at most ``MAX_HOLD_MS``), ``FREED``
    or ``UNKNOWN``."""
    lines = (f"{k}\t{min(v, MAX_HOLD_MS) if isinstance(v, int) else v}" for k, v in states.items())
    return ["\n".join(lines).encode()]


def holds_of(reply: list[bytes]) -> dict[str, int | str]:
    """A hold reply read strictly (it comes from a peer)."""
    if len(reply) != 1:
        raise ProtocolFault("a hold reply is one frame of lines")
    lines = reply[0].split(b"\n", MAX_NOTICES_A_MESSAGE) if reply[0] else []
    if len(lines) > MAX_NOTICES_A_MESSAGE:
        raise ProtocolFault(f"a hold reply names over {MAX_NOTICES_A_MESSAGE} requests")
    out: dict[str, int | str] = {}
    for line in lines:
        name, tab, state = line.rpartition(b"\t")
        if not tab or not (state in (b"freed", b"unknown") or _MILLISECONDS.fullmatch(state)):
            raise ProtocolFault("a hold line is not request_id<TAB>milliseconds|freed|unknown")
        value: int | str = state.decode() if state[:1].isalpha() else min(int(state), MAX_HOLD_MS)
        out[name.decode(errors="replace")[:MAX_ID_CHARS]] = value
    return out

"""What two instances must agree on before their caches pair, compared field by field so a
refusal names the first that differs."""

from __future__ import annotations

import json
from typing import Any

from pdplan._bounded import shown
from pdplan._core import UnsupportedPDLayoutError

#: The longest identity a peer may send.
MAX_IDENTITY_BYTES = 4096


def check_identity(own: dict[str, Any], peer_bytes: bytes, peer_role: str) -> None:
    """Refuses a peer whose identity differs from ``own``, naming the first differing field."""
    if len(peer_bytes) > MAX_IDENTITY_BYTES:
        raise UnsupportedPDLayoutError(f"the {peer_role} peer's identity is over 4 KiB")
    try:
        peer = json.loads(peer_bytes)
    except ValueError:
        raise UnsupportedPDLayoutError(f"the {peer_role} peer's identity is not JSON") from None
    if not isinstance(peer, dict):
        raise UnsupportedPDLayoutError(f"the {peer_role} peer's identity is not an object")
    for key in sorted(set(own) | set(peer)):
        if own.get(key) != peer.get(key):
            # Fields of our own are named as they are; one only the peer sends, bounded.
            field = key if key in own else shown(key)
            raise UnsupportedPDLayoutError(
                f"the {peer_role} instance differs in {field}: {shown(peer.get(key))} there, "
                f"{shown(own.get(key))} here; both instances must serve the same model the same "
                "way"
            )

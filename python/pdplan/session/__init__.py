"""The transfer session: what moves a request's KV between a prefill instance and a decode
instance, whatever the runtime. A runtime's adapter describes its cache (``WorkerCache``: the
buffers pdplan reads from its tensors, the groups sharing block ids, the identity two sides
must share), makes an engine, and drives two objects from its own hooks:

- ``PrefillRank`` serves the side channel (handshakes, "done", streams' progress) and holds
  requests' blocks until every decode rank that reads them is done or their lease ends;
- ``DecodeRank`` takes ``Receive``s, connects to their prefill instances in the background,
  reads, and reports requests done, failed (with their blocks to recompute) or released.

Faults are typed (``TransferFault`` and its subclasses, all ``UnsupportedPDLayoutError``s);
``SessionStats`` counts what each rank did. Nothing here imports a runtime: vLLM's adapter is
``pdplan.connectors.vllm``."""

from __future__ import annotations

from pdplan.session._cache import GroupCache, WorkerCache
from pdplan.session._decode_rank import DecodeRank
from pdplan.session._engines import TransferEngine, make_engine
from pdplan.session._faults import (
    LayoutRefused,
    PeerGone,
    ProtocolFault,
    SettingsFault,
    TransferFailed,
    TransferFault,
    VersionSkew,
)
from pdplan.session._memory import HOST, Memory
from pdplan.session._metrics import SessionStats
from pdplan.session._prefill_rank import PrefillRank
from pdplan.session._progress import Progress
from pdplan.session._requests import Receive, Remote, Stream
from pdplan.session._settings import Settings

__all__ = [
    "HOST",
    "DecodeRank",
    "GroupCache",
    "LayoutRefused",
    "Memory",
    "PeerGone",
    "PrefillRank",
    "Progress",
    "ProtocolFault",
    "Receive",
    "Remote",
    "SessionStats",
    "Settings",
    "SettingsFault",
    "Stream",
    "TransferEngine",
    "TransferFailed",
    "TransferFault",
    "VersionSkew",
    "WorkerCache",
    "make_engine",
]

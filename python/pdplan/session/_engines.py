"""The transfer engines a connector reads through: NIXL (UCX) and Mooncake's transfer engine,
behind one small interface. The decode rank reads (pulls) the prefill rank's bytes; memory is
registered whole tensors at a time, host or device memory (``Memory``), and again after a
runtime took it back (``deregister``, then ``register``: sleep mode, weight reloads)."""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from pdplan._bounded import shown
from pdplan.session._faults import SettingsFault
from pdplan.session._memory import HOST, Memory, tagged, untagged

Addresses = npt.NDArray[np.uint64]
#: NIXL 1.5's strided rows: ``(address, length, device, stride, count)``, N x 5.
Rows = npt.NDArray[np.uint64]

logger = logging.getLogger("pdplan.session")

#: Mooncake fails a batch of 4,096 descriptors or more: read in batches below that.
MOONCAKE_BATCH = 2048


class TransferEngine(Protocol):
    """What the connector needs of an engine."""

    def register(self, regions: list[tuple[int, int]]) -> None:
        """Registers the cache's memory regions ``(address, bytes)`` (all in the memory the
        engine was made for)."""

    def deregister(self) -> None:
        """Drops every registration (a peer's reads of it fail, never read stale memory)."""

    def metadata(self) -> bytes:
        """What a peer needs to reach this engine (its memory tagged ahead)."""

    def forget(self, peer: bytes) -> None:
        """Drops what was loaded of a peer's metadata (it registered its memory anew)."""

    #: Whether the engine takes strided lists (``read_strided``).
    takes_strided: bool

    def read(self, peer: bytes, local: Addresses, remote: Addresses, lengths: Addresses) -> Any:
        """Starts reading ``remote`` bytes of ``peer`` into ``local``: a handle for ``state``."""

    def read_strided(self, peer: bytes, local: Rows, remote: Rows) -> Any:
        """``read`` of strided lists, row for row, block for block: a handle for ``state``."""

    def state(self, handle: Any) -> str:
        """``"DONE"``, ``"PROC"`` or ``"ERR"``; a finished handle is released (one the
        engine will not release yet stays ``"PROC"``: it may still write)."""

    def abort(self, handle: Any) -> bool:
        """Stops a read in flight: True once the engine says no byte of it can land (it
        ended, or was cancelled and released), False while it may (asked again later)."""

    def close(self) -> None:
        """Releases the engine."""


def _skip_absent_infiniband() -> None:
    # With libibverbs installed but no InfiniBand device, UCX's IB module crashes the
    # process in its destructor at exit: skip the module there.
    devices = "/sys/class/infiniband"
    if not (os.path.isdir(devices) and os.listdir(devices)):
        os.environ.setdefault("UCX_MODULES", "^ib")


#: nixl_agent's construction is patched one agent at a time (``_paced_agent``).
_AGENT_LOCK = threading.Lock()


def _paced_agent(api: Any, name: str, delay_us: int) -> Any:
    """A NIXL agent whose progress thread sleeps ``delay_us`` between polls. NIXL's Python
    ``nixl_agent`` hard-codes ``pthrDelay = 0`` (its thread then keeps a core busy, idle or
    not) and exposes no setting: its call to the bound agent is wrapped, for this one
    construction, to set the delay on the config it passes (an agent another thread makes in
    that moment would get it too; pdplan's own are made one at a time)."""
    config = api.nixl_agent_config(backends=["UCX"])
    bound = getattr(api, "nixlBind", None)
    if delay_us == 0 or bound is None or not hasattr(bound, "nixlAgent"):
        return api.nixl_agent(name, config)
    with _AGENT_LOCK:
        original = bound.nixlAgent

        def paced(agent_name: str, agent_config: Any) -> Any:
            agent_config.pthrDelay = delay_us
            return original(agent_name, agent_config)

        bound.nixlAgent = paced
        try:
            return api.nixl_agent(name, config)
        finally:
            bound.nixlAgent = original


def _nixl_agent(name: str, progress_delay_us: int) -> Any:
    _skip_absent_infiniband()
    try:
        import nixl._api as api
    except ImportError:
        try:
            import nixl_cu12._api as api
        except ImportError:
            raise SettingsFault(
                "engine='nixl' needs NIXL's Python package (pip install nixl), or set "
                "kv_connector_extra_config engine='mooncake'"
            ) from None
    return _paced_agent(api, name, progress_delay_us)


class NixlEngine:
    """A NIXL agent with the UCX backend over host (DRAM) or device (VRAM) memory, each
    side's descriptors naming its own memory and device. Strided lists are prepared per read
    (``prep_xfer_dlist`` of N x 5 rows on each side) and read block by block by index; the
    prepared lists are released with the read."""

    takes_strided = True

    def __init__(self, name: str, progress_delay_us: int = 10, memory: Memory = HOST,
                 agent: Any = None) -> None:  # fmt: skip
        """``agent``: a NIXL agent made elsewhere (one is made by ``name`` otherwise)."""
        if agent is None:
            agent = _nixl_agent(name, progress_delay_us)
        self._agent = agent
        self.memory = memory
        self._registered: Any = None
        self._peers: dict[bytes, tuple[str, Memory]] = {}
        self._lock = threading.Lock()
        self._lists: dict[int, tuple[Any, Any]] = {}  # a strided read's prepared lists

    def register(self, regions: list[tuple[int, int]]) -> None:
        device = self.memory.device
        rows = np.array([[address, size, device] for address, size in regions], dtype=np.uint64)
        self._registered = self._agent.register_memory(rows, self.memory.kind)

    def deregister(self) -> None:
        if self._registered is not None:
            self._agent.deregister_memory(self._registered)
            self._registered = None

    def metadata(self) -> bytes:
        return tagged(self.memory, bytes(self._agent.get_agent_metadata()))

    def _peer(self, metadata: bytes) -> tuple[str, Memory]:
        with self._lock:
            if metadata not in self._peers:
                memory, own = untagged(metadata)
                name = self._agent.add_remote_agent(own)
                name = name.decode() if isinstance(name, bytes) else name
                self._peers[metadata] = (name, memory)
            return self._peers[metadata]

    def forget(self, peer: bytes) -> None:
        with self._lock:
            known = self._peers.pop(peer, None)
            if known is not None:
                self._agent.remove_remote_agent(known[0])

    def read(self, peer: bytes, local: Addresses, remote: Addresses, lengths: Addresses) -> Any:
        name, theirs = self._peer(peer)
        own = self.memory
        mine = np.full_like(lengths, own.device)
        dst = self._agent.get_xfer_descs(np.column_stack((local, lengths, mine)), own.kind)
        yours = np.full_like(lengths, theirs.device)
        src = self._agent.get_xfer_descs(np.column_stack((remote, lengths, yours)), theirs.kind)
        handle = self._agent.initialize_xfer("READ", dst, src, name)
        if self._agent.transfer(handle) == "ERR":
            self._agent.release_xfer_handle(handle)
            return None
        return handle

    def read_strided(self, peer: bytes, local: Rows, remote: Rows) -> Any:
        name, memory = self._peer(peer)
        local, remote = local.copy(), remote.copy()
        local[:, 2], remote[:, 2] = self.memory.device, memory.device  # each row's device
        mine = self._agent.prep_xfer_dlist("NIXL_INIT_AGENT", local, self.memory.kind)
        theirs = self._agent.prep_xfer_dlist(name, remote, memory.kind)
        every = np.arange(int(local[:, 4].sum()), dtype=np.int32)
        handle = self._agent.make_prepped_xfer("READ", mine, every, theirs, every)
        self._lists[id(handle)] = (mine, theirs)
        if self._agent.transfer(handle) == "ERR":
            self._release(handle)
            return None
        return handle

    def _release(self, handle: Any) -> None:
        self._agent.release_xfer_handle(handle)  # raises while NIXL cannot stop it: kept
        for prepared in self._lists.pop(id(handle), ()):
            try:
                self._agent.release_dlist_handle(prepared)
            except Exception:  # the read is released; only its prepared list leaks
                logger.exception("pdplan: NIXL did not release a read's prepared list")

    def state(self, handle: Any) -> str:
        if handle is None:
            return "ERR"
        state = str(self._agent.check_xfer_state(handle))
        if state in ("DONE", "ERR") and not self.abort(handle):
            return "PROC"  # a status error does not say the backend stopped writing
        return state

    def abort(self, handle: Any) -> bool:
        """Releases the handle: NIXL cancels a transfer still active, or refuses (raises,
        NIXL_ERR_REPOST_ACTIVE) while it cannot, and the handle is kept."""
        if handle is None:
            return True
        try:
            self._release(handle)
        except Exception:
            return False
        return True

    def close(self) -> None:
        return None


class MooncakeEngine:
    """Mooncake's transfer engine (TCP transport, P2P handshake): reads run synchronously on
    a worker thread, so the engine step is never blocked. It has no strided form: it reads
    flat descriptors. Device memory is registered at its location (``cuda:N``), which only
    Mooncake's CUDA build can."""

    takes_strided = False

    def __init__(self, host: str, memory: Memory = HOST) -> None:
        try:
            from mooncake.engine import TransferEngine as Mooncake
        except ImportError:
            raise SettingsFault(
                "engine='mooncake' needs Mooncake's transfer engine (pip install "
                "mooncake-transfer-engine, and Debian's libibverbs1)"
            ) from None
        if memory.kind == "VRAM" and _mooncake_without_cuda():
            raise SettingsFault(
                "this KV cache is in device memory and the Mooncake installed is its "
                "non-CUDA build (mooncake-transfer-engine-non-cuda), which registers host "
                "memory only: install mooncake-transfer-engine, or use engine='nixl'"
            )
        self.memory = memory
        self._regions: list[int] = []
        self._engine = Mooncake()
        if self._engine.initialize(host, "P2PHANDSHAKE", "tcp", "") != 0:
            raise SettingsFault(f"Mooncake's transfer engine did not start on {host}")
        self._host = host
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdplan-mooncake")

    def register(self, regions: list[tuple[int, int]]) -> None:
        device = self.memory.kind == "VRAM"
        # Host memory as every Mooncake build takes it; a device's location only where it is.
        where = (f"cuda:{self.memory.device}",) if device else ()
        for address, size in regions:
            if self._engine.register_memory(address, size, *where) != 0:
                raise SettingsFault(f"Mooncake could not register {size} bytes {where}")
            self._regions.append(address)

    def deregister(self) -> None:
        for address in self._regions:
            self._engine.unregister_memory(address)
        self._regions = []

    def metadata(self) -> bytes:
        return tagged(self.memory, f"{self._host}:{self._engine.get_rpc_port()}".encode())

    def forget(self, peer: bytes) -> None:
        return None  # Mooncake resolves a peer's segment by name, on each read

    def read(self, peer: bytes, local: Addresses, remote: Addresses, lengths: Addresses) -> Any:
        _, address = untagged(peer)
        return self._pool.submit(self._read, address.decode(errors="replace"), local, remote,
                                 lengths)  # fmt: skip

    def read_strided(self, peer: bytes, local: Rows, remote: Rows) -> Any:
        raise SettingsFault("Mooncake's transfer engine reads flat descriptors only")

    def _read(self, peer: str, local: Addresses, remote: Addresses, lengths: Addresses) -> int:
        for start in range(0, len(lengths), MOONCAKE_BATCH):
            part = slice(start, start + MOONCAKE_BATCH)
            status = int(
                self._engine.batch_transfer_sync_read(
                    peer, local[part].tolist(), remote[part].tolist(), lengths[part].tolist()
                )
            )
            if status != 0:
                return status
        return 0

    def state(self, handle: Any) -> str:
        if handle is None:
            return "ERR"
        future: Future[int] = handle
        if not future.done():
            return "PROC"
        return "DONE" if future.exception() is None and future.result() == 0 else "ERR"

    def abort(self, handle: Any) -> bool:
        """Mooncake's transfer engine cannot cancel a read: it has ended once its
        synchronous call returned (its own timeout bounds it)."""
        return handle is None or bool(handle.done())

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _mooncake_without_cuda() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("mooncake-transfer-engine")
    except PackageNotFoundError:
        return True
    return False


def make_engine(
    kind: str, name: str, host: str, nixl_progress_delay_us: int = 10, memory: Memory = HOST
) -> TransferEngine:
    """The engine ``kind`` names (``"nixl"`` or ``"mooncake"``), registering ``memory``."""
    if kind == "nixl":
        return NixlEngine(name, nixl_progress_delay_us, memory)
    if kind == "mooncake":
        return MooncakeEngine(host, memory)
    raise SettingsFault(
        f"kv_connector_extra_config engine={shown(kind)} is not one pdplan drives: use 'nixl' or "
        "'mooncake'"
    )

"""The transfer engines a connector reads through: NIXL (UCX) and Mooncake's transfer engine,
behind one small interface. The decode rank reads (pulls) the prefill rank's bytes; memory is
registered once, whole tensors."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from pdplan._bounded import shown
from pdplan.session._faults import SettingsFault

Addresses = npt.NDArray[np.uint64]
#: NIXL 1.5's strided rows: ``(address, length, device, stride, count)``, N x 5.
Rows = npt.NDArray[np.uint64]

#: Mooncake fails a batch of 4,096 descriptors or more: read in batches below that.
MOONCAKE_BATCH = 2048


class TransferEngine(Protocol):
    """What the connector needs of an engine."""

    def register(self, regions: list[tuple[int, int]]) -> None:
        """Registers host memory regions ``(address, bytes)``."""

    def metadata(self) -> bytes:
        """What a peer needs to reach this engine."""

    #: Whether the engine takes strided lists (``read_strided``).
    takes_strided: bool

    def read(self, peer: bytes, local: Addresses, remote: Addresses, lengths: Addresses) -> Any:
        """Starts reading ``remote`` bytes of ``peer`` into ``local``: a handle for ``state``."""

    def read_strided(self, peer: bytes, local: Rows, remote: Rows) -> Any:
        """``read`` of strided lists, row for row, block for block: a handle for ``state``."""

    def state(self, handle: Any) -> str:
        """``"DONE"``, ``"PROC"`` or ``"ERR"``; a finished handle is released."""

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


class NixlEngine:
    """A NIXL agent with the UCX backend over host (DRAM) memory. Strided lists are prepared
    per read (``prep_xfer_dlist`` of N x 5 rows on each side) and read block by block by
    index; the prepared lists are released with the read."""

    takes_strided = True

    def __init__(self, name: str, progress_delay_us: int = 10) -> None:
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
        self._agent = _paced_agent(api, name, progress_delay_us)
        self._peers: dict[bytes, str] = {}
        self._lock = threading.Lock()
        self._lists: dict[int, tuple[Any, Any]] = {}  # a strided read's prepared lists

    def register(self, regions: list[tuple[int, int]]) -> None:
        rows = np.array([[address, size, 0] for address, size in regions], dtype=np.uint64)
        self._agent.register_memory(rows, "DRAM")

    def metadata(self) -> bytes:
        return bytes(self._agent.get_agent_metadata())

    def _peer(self, metadata: bytes) -> str:
        with self._lock:
            if metadata not in self._peers:
                name = self._agent.add_remote_agent(metadata)
                self._peers[metadata] = name.decode() if isinstance(name, bytes) else name
            return self._peers[metadata]

    def read(self, peer: bytes, local: Addresses, remote: Addresses, lengths: Addresses) -> Any:
        zeros = np.zeros_like(lengths)
        dst = self._agent.get_xfer_descs(np.column_stack((local, lengths, zeros)), "DRAM")
        src = self._agent.get_xfer_descs(np.column_stack((remote, lengths, zeros)), "DRAM")
        handle = self._agent.initialize_xfer("READ", dst, src, self._peer(peer))
        if self._agent.transfer(handle) == "ERR":
            self._agent.release_xfer_handle(handle)
            return None
        return handle

    def read_strided(self, peer: bytes, local: Rows, remote: Rows) -> Any:
        name = self._peer(peer)
        mine = self._agent.prep_xfer_dlist("NIXL_INIT_AGENT", local, "DRAM")
        theirs = self._agent.prep_xfer_dlist(name, remote, "DRAM")
        every = np.arange(int(local[:, 4].sum()), dtype=np.int32)
        handle = self._agent.make_prepped_xfer("READ", mine, every, theirs, every)
        self._lists[id(handle)] = (mine, theirs)
        if self._agent.transfer(handle) == "ERR":
            self._release(handle)
            return None
        return handle

    def _release(self, handle: Any) -> None:
        self._agent.release_xfer_handle(handle)
        for prepared in self._lists.pop(id(handle), ()):
            self._agent.release_dlist_handle(prepared)

    def state(self, handle: Any) -> str:
        if handle is None:
            return "ERR"
        state = str(self._agent.check_xfer_state(handle))
        if state in ("DONE", "ERR"):
            self._release(handle)
        return state

    def close(self) -> None:
        return None


class MooncakeEngine:
    """Mooncake's transfer engine (TCP transport, P2P handshake): reads run synchronously on
    a worker thread, so the engine step is never blocked. It has no strided form: it reads
    flat descriptors."""

    takes_strided = False

    def __init__(self, host: str) -> None:
        try:
            from mooncake.engine import TransferEngine as Mooncake
        except ImportError:
            raise SettingsFault(
                "engine='mooncake' needs Mooncake's transfer engine (pip install "
                "mooncake-transfer-engine, and Debian's libibverbs1)"
            ) from None
        self._engine = Mooncake()
        if self._engine.initialize(host, "P2PHANDSHAKE", "tcp", "") != 0:
            raise SettingsFault(f"Mooncake's transfer engine did not start on {host}")
        self._host = host
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdplan-mooncake")

    def register(self, regions: list[tuple[int, int]]) -> None:
        for address, size in regions:
            if self._engine.register_memory(address, size) != 0:
                raise SettingsFault(f"Mooncake could not register {size} bytes")

    def metadata(self) -> bytes:
        return f"{self._host}:{self._engine.get_rpc_port()}".encode()

    def read(self, peer: bytes, local: Addresses, remote: Addresses, lengths: Addresses) -> Any:
        return self._pool.submit(self._read, peer.decode(), local, remote, lengths)

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
        future: Future[int] = handle
        if not future.done():
            return "PROC"
        return "DONE" if future.exception() is None and future.result() == 0 else "ERR"

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def make_engine(
    kind: str, name: str, host: str, nixl_progress_delay_us: int = 10
) -> TransferEngine:
    """The engine ``kind`` names (``"nixl"`` or ``"mooncake"``)."""
    if kind == "nixl":
        return NixlEngine(name, nixl_progress_delay_us)
    if kind == "mooncake":
        return MooncakeEngine(host)
    raise SettingsFault(
        f"kv_connector_extra_config engine={shown(kind)} is not one pdplan drives: use 'nixl' or "
        "'mooncake'"
    )

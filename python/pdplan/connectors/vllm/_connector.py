"""``PdplanConnector``: vLLM's connector interface mapped onto the scheduler side
(``_scheduler``) and the worker side: the transfer session's ``PrefillRank`` serves and its
``DecodeRank`` pulls (``pdplan.session``), over the cache ``_caches`` describes."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)

from pdplan._bounded import shown
from pdplan._core import UnsupportedPDLayoutError
from pdplan.connectors.vllm._caches import describe, numbering, regions
from pdplan.connectors.vllm._metadata import StepMetadata
from pdplan.connectors.vllm._ranks import Ranks
from pdplan.connectors.vllm._scheduler import SchedulerSide
from pdplan.connectors.vllm._stages import whole_model
from pdplan.connectors.vllm._stats import PdplanPromMetrics, PdplanStats
from pdplan.session import (
    DecodeRank,
    PrefillRank,
    SessionStats,
    Settings,
    SettingsFault,
    TransferEngine,
    WorkerCache,
    make_engine,
)
from pdplan.session._metrics import is_empty

logger = logging.getLogger("vllm.pdplan")  # under vLLM's handlers


@dataclass
class Registration(KVConnectorHandshakeMetadata):  # type: ignore[misc]
    """What a worker tells its scheduler after registering the cache: how many times it
    has (``restore_kv_caches`` registers again). vLLM collects it at start and after a
    wake-up."""

    generation: int


@dataclass
class RegisteredAgain(KVConnectorWorkerMetadata):  # type: ignore[misc]
    """The same, with a step's output, once after each registration (a weight reload
    re-registers without vLLM collecting handshake metadata again)."""

    generation: int

    def aggregate(self, other: Any) -> RegisteredAgain:
        theirs = other.generation if isinstance(other, RegisteredAgain) else 0
        return RegisteredAgain(max(self.generation, theirs))


def _session_logs_under_vllm() -> None:
    """The session logs to ``pdplan``; inside vLLM its lines go where vLLM's go."""
    session, engine = logging.getLogger("pdplan"), logging.getLogger("vllm")
    if not session.handlers and engine.handlers:
        for handler in engine.handlers:
            session.addHandler(handler)
        session.setLevel(engine.getEffectiveLevel())
        session.propagate = False


class PdplanConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """A vLLM KV connector that plans every transfer with pdplan."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        self._settings = Settings.of(transfer.kv_connector_extra_config)
        device = str(getattr(transfer, "kv_buffer_device", "cpu") or "cpu")
        if device not in ("cpu", "cuda"):
            raise SettingsFault(
                f"PdplanConnector registers the KV cache where it lives, host (cpu) or CUDA "
                f"device memory; kv_buffer_device={shown(device)} is neither"
            )
        self._buffer_device = device
        self._producer = bool(transfer.is_kv_producer)
        self._consumer = bool(transfer.is_kv_consumer)
        self._engine_id = str(transfer.engine_id)
        self._scheduler: SchedulerSide | None = None
        self._prefill: PrefillRank | None = None
        self._decode: DecodeRank | None = None
        self._engine: TransferEngine | None = None
        self._load_errors: set[int] = set()
        self._stats = SessionStats()
        self._layer_of: dict[str, int | None] = {}  # model layer by vLLM layer name
        self._numbering = numbering(vllm_config)
        # The regions registered, and how many times (a restore registers them again).
        self._regions: list[tuple[int, int]] = []
        self._generation = 0
        self._generation_told = 1  # the first is told through the handshake metadata
        self._on_device = False
        _session_logs_under_vllm()
        self._ranks = Ranks.of(vllm_config)
        self._port = self._ranks.base_port(self._settings.side_channel_port)
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(
                self._engine_id, self._settings, self._ranks, self._port, kv_cache_config
            )

    # -- worker side --------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

        ranks, tp_rank = self._ranks, get_tensor_model_parallel_rank()
        stage = get_pp_group().rank_in_group if ranks.pp_size > 1 else 0
        rank, size = ranks.rank(tp_rank, stage), ranks.tp_size

        def own_cache() -> WorkerCache:
            return describe(self._vllm_config, self._kv_cache_config, kv_caches)

        # With stages, both sides plan with the whole model's buffers.
        cache = whole_model(own_cache, stage, get_pp_group()) if ranks.pp_size > 1 else own_cache()
        host = self._settings.side_channel_host
        self._regions, memory = regions(kv_caches, self._buffer_device)
        self._on_device = memory.kind == "VRAM"
        self._engine = make_engine(
            self._settings.engine, f"{self._engine_id}-{rank}", host,
            self._settings.nixl_progress_delay_us, memory,
        )  # fmt: skip
        self._engine.register(self._regions)
        self._generation = 1
        strided = self._settings.descriptors != "flat" and self._engine.takes_strided
        model = self._settings.cost_model()
        if self._producer:
            self._prefill = PrefillRank(cache, rank, size, self._engine, host, self._port,
                                        self._stats, self._generation,
                                        ranks.layout("prefill"))  # fmt: skip
        if self._consumer:
            self._decode = DecodeRank(
                cache, rank, size, self._engine,
                self._settings.handshake_timeout_seconds,
                self._settings.transfer_timeout_seconds, strided, model, self._stats,
                ranks.layout("decode"),
            )  # fmt: skip
        logger.info(
            "pdplan: rank %d of %d registered %d buffers in %s (%s, %s%s)",
            rank, ranks.ranks, len(cache.cache.buffers), memory.tag().decode(),
            self._settings.engine,
            "producer" if self._producer else "consumer",
            ", strided reads where the cost model says" if self._consumer and strided else "",
        )  # fmt: skip

    # -- registered memory: vLLM 0.33's sleep mode, 0.34's extensible cache ---------------

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: Any) -> Any:
        """vLLM 0.34: the cache is registered with an RDMA engine, so each layer's region
        must be one allocation (vLLM's extensible cache defragments it for such
        connectors)."""
        from vllm.config.kv_transfer import KVCacheAccess

        return KVCacheAccess.REGISTERS

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        """vLLM 0.33+: declined. Sleep gives the cache's pages back and wakes on zeroed ones;
        a decode side may hold a request written before sleep and read it after, and only
        the registration generation (which it learns from newer requests) tells it that those
        blocks are gone. vLLM then refuses ``enable_sleep_mode`` at startup, naming this
        connector."""
        return False

    def unregister_kv_caches(self) -> None:
        """vLLM 0.34's weight reload lends the cache out (it calls this whether or not sleep
        mode is supported): the registration is dropped until ``restore_kv_caches``."""
        if self._engine is not None and self._regions:
            self._engine.deregister()
            logger.info("pdplan: the KV cache's registration dropped (sleep or reload)")

    def restore_kv_caches(self) -> None:
        """The cache is back: the same regions are registered again and the registration
        generation moves on. The scheduler side learns it from the next step's output
        (``build_connector_worker_meta``; after a wake-up vLLM also collects the handshake
        metadata again) and puts it in ``kv_transfer_params``; each handshake says it too. A
        decode side that met the old one handshakes anew, and fails (recomputes) a request of
        an older one."""
        if self._engine is None or not self._regions:
            return
        self._engine.deregister()  # idempotent: restore without unregister registers once
        self._engine.register(self._regions)
        self._generation += 1
        if self._prefill is not None:
            self._prefill.registered_again(self._generation)
        logger.info("pdplan: the KV cache registered again (generation %d)", self._generation)

    def get_handshake_metadata(self) -> Registration | None:
        return None if self._engine is None else Registration(self._generation)

    def build_connector_worker_meta(self) -> RegisteredAgain | None:
        if self._generation <= self._generation_told:
            return None
        self._generation_told = self._generation
        return RegisteredAgain(self._generation)

    def set_xfer_handshake_metadata(self, metadata: dict[int, Any]) -> None:
        if self._scheduler is not None:
            self._scheduler.registered(
                [m.generation for m in metadata.values() if isinstance(m, Registration)]
            )

    def set_xfer_handshake_metadata_pp_aware(self, metadata: dict[tuple[int, int], Any]) -> None:
        """Every stage's workers' registrations (vLLM keys them by ``(pp_rank, tp_rank)``):
        each stage registers its own layers' cache, and serves them on its own ranks' ports."""
        self.set_xfer_handshake_metadata(dict(enumerate(metadata.values())))

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        super().bind_connector_metadata(connector_metadata)
        # Bound before the step's forward pass (vLLM starts loads after it): the streams it
        # makes final are known to the layers it saves.
        if self._prefill is not None and isinstance(connector_metadata, StepMetadata):
            if connector_metadata.progress:
                self._prefill.expect(connector_metadata.progress)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._connector_metadata
        if not isinstance(meta, StepMetadata):
            return
        if self._prefill is not None and meta.leases:
            self._prefill.lease(meta.leases)
        if self._decode is not None and (meta.held or meta.unheld):
            self._decode.hold(meta.held)
            self._decode.unhold(meta.unheld)
        if self._decode is not None and meta.cancelled:
            self._decode.cancel(meta.cancelled)
        if self._decode is not None and meta.receives:
            self._decode.start(meta.receives)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:  # fmt: skip
        # The layer's cache holds the step's tokens now: streams may read them before the
        # step's other layers are done (the CPU backend writes synchronously).
        if self._prefill is not None:
            if layer_name not in self._layer_of:
                try:
                    self._layer_of[layer_name] = self._numbering(layer_name)
                except UnsupportedPDLayoutError:  # never fails the forward pass: not read ahead
                    self._layer_of[layer_name] = None
            layer = self._layer_of[layer_name]
            # A device's layer kernels may still run when it is handed over: its tokens are
            # published with the step's (``wait_for_save``), not read ahead.
            if layer is not None and not self._on_device:
                self._prefill.saved(layer)

    def wait_for_save(self) -> None:
        # The step's forward pass is done: its streams' tokens are final in the cache once
        # its kernels are (the CPU backend computes synchronously; a device's are waited for,
        # only in steps that run streams).
        if self._prefill is not None:
            if self._on_device and self._prefill.streaming:
                import torch

                torch.cuda.current_stream().synchronize()
            self._prefill.publish()

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        sending: set[str] = set()
        recving: set[str] = set()
        failed: set[str] = set()
        if self._prefill is not None:
            sending = self._prefill.freed()
        if self._decode is not None:
            self._decode.poll()
            recving, failed, blocks = self._decode.take_finished()
            # vLLM maps failed blocks back to requests only with one KV cache group; with more
            # it recomputes the requests reported failed, and refuses block ids.
            if len(self._kv_cache_config.kv_cache_groups) == 1:
                self._load_errors |= blocks
            sending |= self._decode.take_released()
        return KVConnectorTransferResults(
            finished_sending=sending, finished_recving=recving, failed_recving=failed
        )

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending, results.finished_recving

    def get_kv_connector_stats(self) -> PdplanStats | None:
        """The worker's counts since the last step (vLLM adds up its workers')."""
        taken = self._stats.take()
        return None if is_empty(taken) else PdplanStats(data=taken)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> PdplanStats:
        return PdplanStats(data=data or {})

    @classmethod
    def build_prom_metrics(
        cls, vllm_config: Any, metric_types: Any, labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> PdplanPromMetrics:  # fmt: skip
        return PdplanPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_block_ids_with_load_errors(self) -> set[int]:
        blocks, self._load_errors = self._load_errors, set()
        return blocks

    def shutdown(self) -> None:
        if self._prefill is not None:
            self._prefill.close()
        if self._decode is not None:
            self._decode.close()
        if self._engine is not None:
            self._engine.close()

    # -- scheduler side -----------------------------------------------------------------

    def _side(self) -> SchedulerSide:
        if self._scheduler is None:
            raise RuntimeError("a scheduler-side method was called on a worker's connector")
        return self._scheduler

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        return self._side().matched_tokens(request, num_computed_tokens)

    def on_new_request(self, request: Any) -> None:
        self._side().new_request(request)

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
        # A load restores every group the connector moves, not only the prefix-cacheable
        # ones vLLM assumes by default (it would zero the state groups' blocks).
        return tuple(self._kv_cache_config.transfer_group_ids)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._side().after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> StepMetadata:
        return self._side().step(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        told = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(told, RegisteredAgain):
            self._side().registered([told.generation])
        self._side().freed(
            set(getattr(connector_output, "finished_sending", None) or ()),
            set(getattr(connector_output, "finished_recving", None) or ()),
        )

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        return self._side().finished(request, block_ids)

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._side().finished(request, block_ids)

    def has_pending_block_frees(self) -> bool:
        return self._scheduler is not None and self._scheduler.holding

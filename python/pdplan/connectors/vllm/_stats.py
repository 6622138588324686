"""The session's counts as vLLM takes a connector's stats: each worker's ``SessionStats``
taken every step (``get_kv_connector_stats``), added across workers and intervals
(``aggregate``), logged (``reduce``) and exported to Prometheus (``PdplanPromMetrics``, on
``vllm serve``'s ``/metrics`` as ``vllm:pdplan_*``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from pdplan.session._metrics import add, is_empty

#: Counts exported as Prometheus counters: the session's name -> what the counter says.
COUNTERS = {
    "transfers": "A step's reads of KV that landed (every source rank's), or a stream's slice.",
    "requests_read": "Requests whose KV landed, counted by each decode rank that read them.",
    "reads_posted": "Engine reads posted.",
    "bytes_read": "Bytes of KV read from prefill ranks, counted once landed.",
    "descriptors_posted": "Flat (src, dst, length) descriptors posted to the engine.",
    "rows_posted": "Strided rows posted to the engine.",
    "leases_expired": "Requests a prefill rank freed at their lease's end, unread.",
    "leases_renewed": "Leases a prefill rank renewed for a decode side's holds.",
    "holds_sent": "Requests a decode rank asked a prefill rank to hold (renewals, confirmations).",
}
#: Failures by cause: the session's kind -> the counter and what it says.
FAILURES = {
    "requests": ("failed_requests", "Requests whose KV could not be read, by cause."),
    "recomputed_blocks": ("recomputed_blocks", "Blocks handed back to be recomputed, by cause."),
    "refused": ("refused_side_channel_requests", "Side-channel requests refused, by cause."),
}
#: Buckets of transfer time, seconds.
TIME_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0]


@dataclass
class PdplanStats(KVConnectorStats):  # type: ignore[misc,unused-ignore]
    """One interval's counts of one or more workers (``SessionStats.take``'s)."""

    def __post_init__(self) -> None:
        if not self.data:
            self.reset()

    def reset(self) -> None:
        self.data: dict[str, Any] = {"counts": {}, "failures": {}, "transfer_seconds": []}

    def aggregate(self, other: KVConnectorStats) -> PdplanStats:
        self.data = add(self.data, other.data)
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = dict(self.data.get("counts", {}))
        out.update(self.data.get("failures", {}))
        times = self.data.get("transfer_seconds", [])
        if times:
            out["mean transfer ms"] = round(1e3 * sum(times) / len(times), 3)
        return out

    def is_empty(self) -> bool:
        return is_empty(self.data)


class PdplanPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc,unused-ignore]
    """The session's counts as ``vllm:pdplan_*`` counters (failures labelled by cause) and a
    histogram of transfer time."""

    def __init__(self, vllm_config: Any, metric_types: Any, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]) -> None:  # fmt: skip
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        # vLLM's metric classes (its own multiprocess-aware subclasses of Prometheus').
        counter: Any = self._counter_cls
        histogram: Any = self._histogram_cls
        self._counters = {
            name: self._per_engine(counter(
                name=f"vllm:pdplan_{name}", documentation=text, labelnames=labelnames))
            for name, text in COUNTERS.items()
        }  # fmt: skip
        self._failures = {
            kind: counter(name=f"vllm:pdplan_{name}", documentation=text,
                                    labelnames=[*labelnames, "cause"])
            for kind, (name, text) in FAILURES.items()
        }  # fmt: skip
        self._times = self._per_engine(histogram(
            name="vllm:pdplan_transfer_time_seconds", buckets=TIME_BUCKETS,
            documentation="Time from posting a read of KV to its landing, seen a step at a time.",
            labelnames=labelnames))  # fmt: skip

    def _per_engine(self, metric: Any) -> dict[int, Any]:
        return {idx: metric.labels(*values) for idx, values in self.per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: Any, engine_idx: int = 0) -> None:
        data = getattr(transfer_stats_data, "data", transfer_stats_data)
        for name, value in data.get("counts", {}).items():
            if name in self._counters and value:
                self._counters[name][engine_idx].inc(value)
        labels = self.per_engine_labelvalues[engine_idx]
        for key, value in data.get("failures", {}).items():
            kind, _, cause = key.partition(":")
            if kind in self._failures:
                self._failures[kind].labels(*labels, cause).inc(value)
        for seconds in data.get("transfer_seconds", []):
            self._times[engine_idx].observe(seconds)

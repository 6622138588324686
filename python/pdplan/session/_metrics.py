"""What a rank's session did since it was last asked: reads posted and landed, their bytes
and descriptors, their time, and every failure by cause. Counted by the session whatever the
runtime; a runtime's adapter hands the counts to its metrics (vLLM: ``get_kv_connector_stats``
to Prometheus). Taken as deltas, so counts from many ranks add up."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

#: Transfer times kept a snapshot at most (a histogram's observations; counts stay exact).
MAX_TIMES_KEPT = 4096


class SessionStats:
    """Counts since the last ``take``; safe from the session's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._failures: Counter[str] = Counter()
        self._times: list[float] = []

    def posted(self, descriptors: int, rows: int) -> None:
        """An engine read posted: its flat descriptors and strided rows."""
        with self._lock:
            self._counts.update(reads_posted=1, descriptors_posted=descriptors, rows_posted=rows)

    def read(self, requests: int, moved_bytes: int, seconds: float) -> None:
        """A step's reads landed (of every source rank), ``seconds`` after they were posted:
        their bytes, and the requests they completed."""
        with self._lock:
            self._counts.update(transfers=1, requests_read=requests, bytes_read=moved_bytes)
            self._counts["transfer_microseconds"] += round(seconds * 1e6)
            if len(self._times) < MAX_TIMES_KEPT:
                self._times.append(seconds)

    def failed(self, cause: str, blocks: int = 0) -> None:
        """A request failed for ``cause``; its ``blocks`` go back to be recomputed."""
        with self._lock:
            self._failures[f"requests:{cause}"] += 1
            if blocks:
                self._failures[f"recomputed_blocks:{cause}"] += blocks

    def refused(self, cause: str) -> None:
        """A side-channel request this rank refused (prefill side)."""
        with self._lock:
            self._failures[f"refused:{cause}"] += 1

    def expired(self) -> None:
        """A request whose blocks this rank freed at its lease's end, unread."""
        with self._lock:
            self._counts["leases_expired"] += 1

    def renewed(self, requests: int) -> None:
        """Leases this rank renewed for a decode side's holds (prefill side)."""
        with self._lock:
            self._counts["leases_renewed"] += requests

    def held(self, requests: int) -> None:
        """Requests this rank asked prefill ranks to hold (decode side)."""
        with self._lock:
            self._counts["holds_sent"] += requests

    def take(self) -> dict[str, Any]:
        """The counts since the last call (JSON-able), and zero from now."""
        with self._lock:
            out: dict[str, Any] = {
                "counts": dict(self._counts),
                "failures": dict(self._failures),
                "transfer_seconds": list(self._times),
            }
            self._counts, self._failures, self._times = Counter(), Counter(), []
        return out


def is_empty(taken: dict[str, Any]) -> bool:
    return not (taken.get("counts") or taken.get("failures"))


def add(one: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Two ranks' (or two intervals') counts together."""
    counts: Counter[str] = Counter(one.get("counts", {}))
    counts.update(other.get("counts", {}))
    failures: Counter[str] = Counter(one.get("failures", {}))
    failures.update(other.get("failures", {}))
    times = [*one.get("transfer_seconds", []), *other.get("transfer_seconds", [])]
    return {"counts": dict(counts), "failures": dict(failures),
            "transfer_seconds": times[:MAX_TIMES_KEPT]}  # fmt: skip

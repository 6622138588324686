"""Per-request transfer time inside a vLLM worker, for the side-by-side benchmark: from the step
whose ``start_load_kv`` hands a request to the connector to the step whose
``get_transfer_results`` reports it received, the same two hooks of vLLM's ``KVConnectorBase_V1``
wrapped the same way on both connectors. Each worker process appends ``seconds`` lines to
``$PDPLAN_TRANSFER_TIMES`` (installed when that variable is set): ``request_id seconds`` lines; a
request read by several ranks is received when the slowest is done."""

from __future__ import annotations

import os
import time
from typing import Any

ENV = "PDPLAN_TRANSFER_TIMES"


def _receiving(metadata: Any) -> list[str]:
    """The request ids a step's metadata asks the worker to receive, on either connector."""
    if hasattr(metadata, "reqs_to_recv"):  # NixlConnector
        return list(metadata.reqs_to_recv)
    return [r.request_id for r in getattr(metadata, "receives", ()) if r.local_blocks]


def _wrap(cls: Any, path: str) -> None:
    start_load_kv, get_transfer_results = cls.start_load_kv, cls.get_transfer_results
    started: dict[str, float] = {}

    def timed_start(self: Any, forward_context: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        for request_id in _receiving(self._get_connector_metadata()):
            started.setdefault(request_id, now)
        start_load_kv(self, forward_context, **kwargs)

    def timed_results(self: Any, finished_req_ids: set[str]) -> Any:
        results = get_transfer_results(self, finished_req_ids)
        now = time.perf_counter()
        lines = [f"{r} {now - started.pop(r)}\n" for r in results.finished_recving if r in started]
        if lines:
            with open(path, "a") as out:
                out.writelines(lines)
        return results

    cls.start_load_kv, cls.get_transfer_results = timed_start, timed_results


def install() -> None:
    """Wraps both connectors' hooks when ``$PDPLAN_TRANSFER_TIMES`` names a file."""
    path = os.environ.get(ENV)
    if not path:
        return
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector

    from pdplan.connectors.vllm import PdplanConnector

    for cls in (NixlConnector, PdplanConnector):
        _wrap(cls, path)


def read(path: str) -> list[float]:
    """Each request's transfer time written so far, its slowest rank's (and forgets them)."""
    if not os.path.exists(path):
        return []
    times: dict[str, float] = {}
    with open(path) as lines:
        for line in lines:
            request_id, seconds = line.split()
            times[request_id] = max(float(seconds), times.get(request_id, 0.0))
    os.remove(path)
    return list(times.values())

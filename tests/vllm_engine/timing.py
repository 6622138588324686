"""Per-request transfer time inside a vLLM worker, for the side-by-side benchmark: from the step
whose ``start_load_kv`` hands a request to the connector to the step whose
``get_transfer_results`` reports it received, the same two hooks of vLLM's ``KVConnectorBase_V1``
wrapped the same way on both connectors. Each worker process appends lines to
``$PDPLAN_TRANSFER_TIMES`` (installed when that variable is set): ``request_id seconds entered
left received`` (the last three ``time.perf_counter`` readings, one clock for every process of
the machine: when ``start_load_kv`` began and ended the step that handed the request over, and
when it was reported received), and ``posted n`` for each read handed to a transfer engine (its
descriptors or strided entries: NIXL's ``initialize_xfer`` or ``make_prepped_xfer``, Mooncake's
batches through pdplan). A request read by several ranks is received when the slowest is
done."""

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

    left: dict[str, float] = {}

    def timed_start(self: Any, forward_context: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        handed = [r for r in _receiving(self._get_connector_metadata()) if r not in started]
        for request_id in handed:
            started[request_id] = now
        start_load_kv(self, forward_context, **kwargs)
        done = time.perf_counter()
        for request_id in handed:
            left[request_id] = done

    def timed_results(self: Any, finished_req_ids: set[str]) -> Any:
        results = get_transfer_results(self, finished_req_ids)
        now = time.perf_counter()
        lines = [
            f"{r} {now - started[r]} {started.pop(r)} {left.pop(r, now)} {now}\n"
            for r in results.finished_recving
            if r in started
        ]
        if lines:
            with open(path, "a") as out:
                out.writelines(lines)
        return results

    cls.start_load_kv, cls.get_transfer_results = timed_start, timed_results


def _count(cls: Any, name: str, path: str, entries: Any) -> None:
    """Wraps ``cls.name`` to append ``posted n`` (``entries(args)``) for each call."""
    original = getattr(cls, name)

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        with open(path, "a") as out:
            out.write(f"posted {entries(args)}\n")
        return original(self, *args, **kwargs)

    setattr(cls, name, counted)


def install() -> None:
    """Wraps both connectors' hooks, and the reads they hand a transfer engine, when
    ``$PDPLAN_TRANSFER_TIMES`` names a file."""
    path = os.environ.get(ENV)
    if not path:
        return
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector

    from pdplan.connectors.vllm import PdplanConnector
    from pdplan.session._engines import MooncakeEngine

    for cls in (NixlConnector, PdplanConnector):
        _wrap(cls, path)
    try:
        from nixl._api import nixl_agent
    except ImportError:
        pass
    else:
        _count(nixl_agent, "make_prepped_xfer", path, lambda args: len(args[2]))
        _count(nixl_agent, "initialize_xfer", path, lambda args: args[1].descCount())
    _count(MooncakeEngine, "read", path, lambda args: len(args[3]))


def read(path: str) -> list[float]:
    """Each request's transfer time written so far, its slowest rank's (and forgets them)."""
    return [seconds for seconds, *_ in read_marks(path)[0].values()]


def read_marks(path: str) -> tuple[dict[str, tuple[float, float, float, float]], int]:
    """Per request written so far, its slowest rank's transfer time and, over its ranks, the
    first ``start_load_kv`` entry, the last exit and the last report received; and the
    entries posted to transfer engines (and forgets them)."""
    if not os.path.exists(path):
        return {}, 0
    marks: dict[str, tuple[float, float, float, float]] = {}
    posted = 0
    with open(path) as lines:
        for line in lines:
            fields = line.split()
            if fields[0] == "posted":
                posted += int(fields[1])
                continue
            request_id, seconds, entered, left, received = fields[0], *map(float, fields[1:])
            known = marks.get(request_id)
            if known is not None:
                seconds, entered = max(seconds, known[0]), min(entered, known[1])
                left, received = max(left, known[2]), max(received, known[3])
            marks[request_id] = (seconds, entered, left, received)
    os.remove(path)
    return marks, posted

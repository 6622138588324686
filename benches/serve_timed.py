"""Runs vLLM's OpenAI server with both connectors' hooks timed (for benches/vllm_load.py):
the time each engine step spends inside the connector, its scheduler side (the hooks vLLM's
scheduler calls) and its worker side (the hooks the model runner calls) apart, the same hooks
wrapped the same way on PdplanConnector and NixlConnector. The engine core is forked from this
process (``VLLM_WORKER_MULTIPROC_METHOD=fork``), so it inherits the wrapped classes. Every 20
steps a process appends ``side steps seconds`` to ``$PDPLAN_HOOK_TIMES``.

    python benches/serve_timed.py --model ... (vllm.entrypoints.openai.api_server's arguments)
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import os
import runpy
import sys
import threading
import time
from typing import Any

ENV = "PDPLAN_HOOK_TIMES"
#: Hooks by side; the first of each marks a step.
SCHEDULER_HOOKS = ("build_connector_meta", "get_num_new_matched_tokens", "on_new_request",
                   "update_state_after_alloc", "update_connector_output", "request_finished",
                   "request_finished_all_groups", "has_pending_block_frees")  # fmt: skip
WORKER_HOOKS = ("bind_connector_metadata", "start_load_kv", "wait_for_layer_load",
                "save_kv_layer", "wait_for_save", "get_finished", "get_transfer_results",
                "clear_connector_metadata", "get_block_ids_with_load_errors",
                "get_kv_connector_stats", "get_finished_count")  # fmt: skip
FLUSH_STEPS = 20


class Side:
    """One side's time and steps since the last flush (one per process)."""

    def __init__(self, name: str, path: str) -> None:
        self.name, self.path = name, path
        self.seconds, self.steps = 0.0, 0

    def step(self) -> None:
        self.steps += 1
        if self.steps >= FLUSH_STEPS:
            with open(self.path, "a") as out:
                out.write(f"{self.name} {self.steps} {self.seconds}\n")
            self.seconds, self.steps = 0.0, 0


_depth = threading.local()


def _wrap(cls: Any, hooks: tuple[str, ...], side: Side) -> None:
    for position, name in enumerate(hooks):
        static = inspect.getattr_static(cls, name, None)
        if static is None or isinstance(static, (classmethod, staticmethod)):
            continue
        original = getattr(cls, name)  # where it is defined: the class or a base

        @functools.wraps(original)
        def timed(self: Any, *args: Any, _original: Any = original, _marks: bool = position == 0,
                  **kwargs: Any) -> Any:  # fmt: skip
            outer = not getattr(_depth, "n", 0)  # a hook calling another is timed once
            _depth.n = getattr(_depth, "n", 0) + 1
            started = time.perf_counter()
            try:
                return _original(self, *args, **kwargs)
            finally:
                _depth.n -= 1
                if outer:
                    side.seconds += time.perf_counter() - started
                    if _marks:
                        side.step()

        setattr(cls, name, timed)


#: The connector classes timed, by the module that defines each.
TIMED = {
    "vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector": "NixlConnector",
    "pdplan.connectors.vllm._connector": "PdplanConnector",
}


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps a timed connector's class once its module has run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in TIMED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, timed_path = spec.loader, self.path

        class Timing(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                cls = getattr(module, TIMED[name])
                # Wrapped on the class vLLM loads, whichever of its bases defines each hook.
                _wrap(cls, SCHEDULER_HOOKS, Side("scheduler", timed_path))
                _wrap(cls, WORKER_HOOKS, Side("worker", timed_path))

        spec.loader = Timing()
        return spec


def watch() -> None:
    """Times the connectors this process imports from now on (``$PDPLAN_HOOK_TIMES`` set)."""
    path = os.environ.get(ENV)
    if path:
        sys.meta_path.insert(0, _Finder(path))


if __name__ == "__main__":
    watch()
    site = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hook_site")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (site, os.environ.get("PYTHONPATH", "")) if p
    )
    sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)

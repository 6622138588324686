"""Real vLLM instances for the connector's tests: a tiny random-weight model written with
transformers, and instances started as processes of their own, driven over a local socket."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: Per instance on this 2-core machine (vLLM's CPU backend): no thread binding, one OpenMP
#: thread, TP 1 in one process.
INSTANCE_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_LOGGING_LEVEL": "INFO",
    "TOKENIZERS_PARALLELISM": "false",
}


MAX_TOKENS = 12
#: Lengths crossing the 32-token block boundaries, one of exactly two blocks.
LENGTHS = (20, 45, 64, 97)


def prompts_of(lengths: tuple[int, ...], salt: int = 0) -> list[list[int]]:
    return [[(37 * i + 11 * j + salt) % 500 + 1 for j in range(n)] for i, n in enumerate(lengths)]


#: Prompts a 64-token prefill chunk splits into several chunks.
STREAMED_LENGTHS = (150, 261, 333)
#: Blocks the prefix-hit prompt shares with a prompt the decode side ran itself.
SHARED_BLOCKS = 3


#: The fault tests' prompts by test (each its own, so no decode-side prefix hit crosses
#: tests): whole blocks (64, 96, 128 tokens) among others, where a proxy's first token opens a
#: block the prefill side never wrote.
FAULT_PROMPTS = {
    "proxy": prompts_of((64, 128, 45, 96), salt=21),
    "queued": prompts_of((50, 70, 90), salt=25),
    "expired": prompts_of((40, 64, 100, 120, 30, 77), salt=27),
    "dropped": prompts_of((33, 64, 81), salt=31),
    "stopped": prompts_of((29, 96, 60), salt=33),
    "killed": prompts_of((47, 64, 88), salt=35),
    "again": prompts_of((52, 75), salt=37),
    # Read first, so the peer is connected when the fault strikes mid-read.
    "warm-stopped": prompts_of((36,), salt=39),
    "warm-killed": prompts_of((38,), salt=45),
}


def proxied_prompts() -> list[list[int]]:
    """Prompts sharing the first two blocks of the proxy test's second (a decode-side prefix
    hit once that one is decoded): one of whole blocks, one not."""
    shared = FAULT_PROMPTS["proxy"][1][:64]
    return [shared + prompts_of((64,), salt=23)[0], shared + prompts_of((41,), salt=23)[0]]


def streamed_prompts() -> list[list[int]]:
    """The streamed prompts, then a prompt sharing its first blocks with the first of them
    (the decode side's prefix hit when it ran that one), then that first prompt's prefix."""
    prompts = prompts_of(STREAMED_LENGTHS, salt=9)
    shared = prompts[0][: SHARED_BLOCKS * 32]
    return [*prompts, shared + prompts_of((170,), salt=13)[0], shared]


#: Where the instances keep their caches: "cpu" here; scripts/test_vllm_gpu.sh sets "cuda".
CACHE_DEVICE = os.environ.get("PDPLAN_TEST_CACHE_DEVICE", "cpu")


def _tiny_model() -> Any:
    """``examples/tiny_model.py``, the guide's model writer: one home for the tiny models."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples" / "tiny_model.py"
    spec = importlib.util.spec_from_file_location("pdplan_example_tiny_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: A tiny random-weight model (Llama or Qwen3, optionally with sliding windows).
write_model = _tiny_model().write_model


def llm_args(model: Path, *, tp: int = 1, connector: dict[str, Any] | None = None,
             block_size: int = 32) -> dict[str, Any]:  # fmt: skip
    args: dict[str, Any] = {
        "model": str(model),
        "skip_tokenizer_init": True,
        "tensor_parallel_size": tp,
        "dtype": "float32",
        "block_size": block_size,
        "max_model_len": 512,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 512,
        "kv_cache_memory_bytes": 64 << 20,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "seed": 0,
    }
    if connector is not None:
        args["kv_transfer_config"] = connector
    return args


def streamed_params(
    prompts: list[list[int]], port: int, max_tokens: int, tag: str = "s"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The prefill and the decode side's parameters of requests that stream: the proxy gives
    both one stream id, and the decode side where the prefill side listens."""
    prefill, decode = [], []
    for i in range(len(prompts)):
        stream = f"{tag}-{i}"
        prefill.append(
            {
                "max_tokens": 1,
                "temperature": 0.0,
                "extra_args": {
                    "kv_transfer_params": {"do_remote_decode": True, "stream_id": stream}
                },
            }
        )
        decode.append(
            {
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "extra_args": {
                    "kv_transfer_params": {
                        "do_remote_prefill": True,
                        "stream_id": stream,
                        "remote_engine_id": "streaming-prefill",
                        "remote_host": "127.0.0.1",
                        "remote_port": port,
                        "tp_size": 1,
                    }
                },
            }
        )
    return prefill, decode  # fmt: skip


def pdplan_connector(role: str, port: int, engine: str = "nixl", **extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": "PdplanConnector",
        "kv_connector_module_path": "pdplan.connectors.vllm",
        "kv_role": role,
        "kv_buffer_device": CACHE_DEVICE,
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "engine": engine, "side_channel_host": "127.0.0.1", "side_channel_port": port,
            **extra,
        },
    }  # fmt: skip


class Instance:
    """One vLLM instance in a process of its own."""

    def __init__(self, llm: dict[str, Any], log: Path, env: dict[str, str] | None = None,
                 serve: bool = True) -> None:  # fmt: skip
        """``serve``: the engine steps between commands while it has work, as a server's
        busy loop does (a prefill side's lease reaches its workers in a step), else only
        inside a command."""
        key = secrets.token_bytes(16)
        self._listener = Listener(("127.0.0.1", 0), authkey=key)
        port = self._listener.address[1]
        self.log = log
        environment = {**os.environ, **INSTANCE_ENV, **(env or {})}
        # Kept open while the process runs.
        self._log_file = open(log, "wb")
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "instance.py"), str(port), key.hex(),
             json.dumps({"llm": llm, "serve": serve})],
            env=environment, stdout=self._log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip
        # Waits for the instance to call back, up to 600 s, but not for one that has exited.
        self._listener._listener._socket.settimeout(2)  # type: ignore[attr-defined]
        deadline = time.monotonic() + 600
        while True:
            try:
                self._conn = self._listener.accept()
                break
            except OSError:
                if self.process.poll() is None and time.monotonic() < deadline:
                    continue
                self.kill()
                why = self.tail()
                self._log_file.close()
                self._listener.close()
                raise RuntimeError(f"the instance did not start: {why}") from None
        kind, self.initial_free = self._conn.recv()
        assert kind == "ready"

    def tail(self, lines: int = 40) -> str:
        self._log_file.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def call(self, command: str, args: Any = None, timeout: float = 300) -> Any:
        self._conn.send((command, args))
        if not self._conn.poll(timeout):
            raise TimeoutError(f"{command} took over {timeout} s:\n{self.tail()}")
        return self._conn.recv()

    def generate(
        self, prompts: list[list[int]], params: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.call("generate", {"prompts": prompts, "params": params})
        return result

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.call("exit", timeout=30)
            except (OSError, EOFError, TimeoutError):
                pass
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log_file.close()
        self._listener.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def prefill_params(n: int) -> list[dict[str, Any]]:
    return [{"max_tokens": 1, "temperature": 0.0,
             "extra_args": {"kv_transfer_params": {"do_remote_decode": True}}}] * n  # fmt: skip


def decode_params(prefilled: list[dict[str, Any]], max_tokens: int) -> list[dict[str, Any]]:
    return [{"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
             "extra_args": {"kv_transfer_params": p["kv_transfer_params"]}}
            for p in prefilled]  # fmt: skip


def hostile_client(port: int, seed: int = 0) -> dict[str, int]:
    """Sends a prefill instance's side channel what no peer would: a 4 KiB nested identity
    (``json.loads``' RecursionError once ended the server thread), 10,000 frames, another
    protocol, an unknown verb with seeded random frames, and raw TCP bytes on connections held
    open meanwhile. Every request must be answered with a refusal; returns how many it sent by
    the cause each must be refused with."""
    import random
    import socket

    import zmq

    from pdplan.session._protocol import PROTOCOL as protocol

    rng = random.Random(seed)
    requests = [
        ([protocol, b"hello", b"[" * 4096, b"1", b"x"], "protocol"),
        ([protocol, *[b"x"] * 10000], "protocol"),
        ([b"GET / HTTP/1.1"], "version"),
    ] + [([protocol, b"\x00junk", *[rng.randbytes(rng.randrange(64)) for _ in range(3)]],
          "protocol") for _ in range(40)]  # fmt: skip
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(16)]
    sent: dict[str, int] = {}
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.connect(f"tcp://127.0.0.1:{port}")
    try:
        for connection in held:
            connection.sendall(rng.randbytes(1024))
        for frames, cause in requests:
            client.send_multipart([b"", *frames])
            assert client.poll(10000), f"no answer to {frames[:2]}"
            reply = client.recv_multipart()
            assert reply[1:2] == [b"refused"] and reply[3:4] == [cause.encode()], reply
            sent[cause] = sent.get(cause, 0) + 1
    finally:
        client.close()
        for connection in held:
            connection.close()
    return sent

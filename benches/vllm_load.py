"""PdplanConnector beside vLLM's NixlConnector under load, as people deploy them: a prefill and
a decode `vllm.entrypoints.openai.api_server` on this CPU (the serving guide's commands, TP 1
each), and clients that each send a request to the prefill server, then its decode request with
the returned ``kv_transfer_params``, streaming the answer. 64 and 256 clients at once, prompts
of mixed lengths; one request in 8 is aborted by its client after its first token (vLLM aborts
it on the decode side) and one in 16 never reaches the decode server (the prefill side holds its
blocks until the lease ends). Figures: time to first decode token at the client (from sending
the prefill request) p50 and p99, decode tokens a second over the run, the connector's own time
per engine step on each server, scheduler side and worker side apart (benches/serve_timed.py
wraps the same hooks on both connectors), and the KV cache each server still uses once every
request ended and the leases ran out (a leak shows there). Needs vLLM (scripts/install_vllm.sh).

    python benches/vllm_load.py   # writes benches/results/vllm_load.md
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benches"))

from tiny_model import write_model  # noqa: E402

from provenance import write  # noqa: E402

#: Clients at once; each run sends twice as many requests.
CONCURRENCY = tuple(int(c) for c in os.environ.get("PDPLAN_LOAD_CONCURRENCY", "64,256").split(","))
#: Prompt tokens and decode tokens, drawn uniformly (max_model_len 512).
PROMPT_TOKENS = (16, 400)
DECODE_TOKENS = (8, 32)
#: Every n-th request: aborted after its first token; never sent to the decode server.
ABORT_AFTER_FIRST, NEVER_DECODED = 8, 16
#: How long a prefill side holds blocks nobody read (both connectors set to it).
LEASE_SECONDS = 20
HOOKS = "PDPLAN_HOOK_TIMES"


def server_args(model: Path, port: int, connector: dict[str, Any]) -> list[str]:
    return [
        "--model", str(model), "--port", str(port), "--skip-tokenizer-init", "--dtype", "float32",
        "--block-size", "32", "--max-model-len", "512", "--max-num-seqs", "256",
        "--max-num-batched-tokens", "4096", "--kv-cache-memory-bytes", str(1 << 30),
        "--enforce-eager", "--kv-transfer-config", json.dumps(connector),
    ]  # fmt: skip


def connector_config(kind: str, role: str, side_port: int) -> dict[str, Any]:
    if kind == "nixl":
        return {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}
    return {"kv_connector": "PdplanConnector", "kv_connector_module_path": "pdplan.connectors.vllm",
            "kv_role": role, "kv_buffer_device": "cpu", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"engine": "nixl", "side_channel_port": side_port,
                                          "kv_lease_seconds": LEASE_SECONDS}}  # fmt: skip


class Server:
    def __init__(self, model: Path, port: int, config: dict[str, Any], env: dict[str, str],
                 logs: Path, name: str) -> None:  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        self.hooks = logs / f"{name}-hooks.txt"
        self.log = open(logs / f"{name}.log", "wb")
        full = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
                "VLLM_NIXL_ABORT_REQUEST_TIMEOUT": str(LEASE_SECONDS), HOOKS: str(self.hooks),
                **env}  # fmt: skip
        command = [sys.executable, str(ROOT / "benches" / "serve_timed.py"),
                   *server_args(model, port, config)]  # fmt: skip
        self.process = subprocess.Popen(command, env=full, stdout=self.log,
                                        stderr=subprocess.STDOUT)  # fmt: skip

    def wait_healthy(self, seconds: float = 400) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.url} exited ({self.log.name})")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5):
                    return
            except OSError:
                time.sleep(1)
        raise TimeoutError(f"{self.url} never became healthy")

    def kv_usage(self) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("vllm:kv_cache_usage_perc"):
                    return float(line.rsplit(" ", 1)[1])
        raise KeyError("vllm:kv_cache_usage_perc")

    def take_hook_times(self) -> dict[str, tuple[int, float]]:
        """Steps and seconds in the connector per side since the last call."""
        out: dict[str, tuple[int, float]] = {}
        if self.hooks.exists():
            for line in self.hooks.read_text().splitlines():
                side, steps, seconds = line.split()
                had = out.get(side, (0, 0.0))
                out[side] = (had[0] + int(steps), had[1] + float(seconds))
            self.hooks.unlink()
        return out

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    return urllib.request.urlopen(request, timeout=900)


def one_request(model: Path, prefill: str, decode: str, index: int,
                rng: random.Random) -> dict[str, Any]:  # fmt: skip
    prompt = [rng.randrange(1, 500) for _ in range(rng.randint(*PROMPT_TOKENS))]
    max_tokens = rng.randint(*DECODE_TOKENS)
    started = time.perf_counter()
    first = {"model": str(model), "prompt": prompt, "max_tokens": 1, "stream": False,
             "kv_transfer_params": {"do_remote_decode": True}}  # fmt: skip
    with post(prefill + "/v1/completions", first) as response:
        params = json.loads(response.read())["kv_transfer_params"]
    if index % NEVER_DECODED == NEVER_DECODED - 1:
        return {"kind": "never_decoded"}
    body = {"model": str(model), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "return_token_ids": True,
            "kv_transfer_params": params}  # fmt: skip
    tokens, ttft = 0, None
    with post(decode + "/v1/completions", body) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            got = sum(len(c.get("token_ids") or ()) for c in chunk.get("choices", ()))
            if got and ttft is None:
                ttft = time.perf_counter() - started
            tokens += got
            if ttft is not None and index % ABORT_AFTER_FIRST == ABORT_AFTER_FIRST - 1:
                return {"kind": "aborted", "ttft": ttft, "tokens": tokens}
    return {"kind": "done", "ttft": ttft, "tokens": tokens, "expected": max_tokens}


def load(model: Path, prefill: Server, decode: Server, clients: int, seed: int) -> dict[str, Any]:
    requests = 2 * clients
    rngs = [random.Random(seed * 100_003 + i) for i in range(requests)]
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda i: one_request(model, prefill.url, decode.url, i, rngs[i]),
                                range(requests)))  # fmt: skip
    wall = time.perf_counter() - started
    done = [r for r in results if r["kind"] == "done"]
    short = [r for r in done if r["tokens"] != r["expected"]]
    ttfts = sorted(r["ttft"] for r in results if r.get("ttft") is not None)
    tokens = sum(r.get("tokens", 0) for r in results)
    return {
        "requests": requests, "done": len(done), "short": len(short),
        "aborted": sum(r["kind"] == "aborted" for r in results),
        "never_decoded": sum(r["kind"] == "never_decoded" for r in results),
        "ttft_p50_ms": statistics.median(ttfts) * 1e3,
        "ttft_p99_ms": ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))] * 1e3,
        "tokens_per_s": tokens / wall, "wall_s": wall,
    }  # fmt: skip


def per_step(times: dict[str, tuple[int, float]], side: str) -> float:
    steps, seconds = times.get(side, (0, 0.0))
    return seconds / steps * 1e6 if steps else float("nan")


def measure(kind: str, model: Path, logs: Path, port: int) -> dict[int, dict[str, Any]]:
    def side(role: str, offset: int) -> dict[str, Any]:
        return connector_config(kind, role, port + offset)

    nixl_port = "VLLM_NIXL_SIDE_CHANNEL_PORT"
    prefill = Server(model, port, side("kv_producer", 50), {nixl_port: str(port + 60)}, logs,
                     f"{kind}-prefill")  # fmt: skip
    decode = Server(model, port + 1, side("kv_consumer", 70), {nixl_port: str(port + 80)}, logs,
                    f"{kind}-decode")  # fmt: skip
    out = {}
    try:
        prefill.wait_healthy()
        decode.wait_healthy()
        load(model, prefill, decode, 8, seed=0)  # warm-up
        for clients in CONCURRENCY:
            time.sleep(2)
            prefill.take_hook_times(), decode.take_hook_times()
            figures = load(model, prefill, decode, clients, seed=clients)
            time.sleep(2)  # the last steps' hook lines
            for name, server in (("prefill", prefill), ("decode", decode)):
                times = server.take_hook_times()
                figures[f"{name}_scheduler_us"] = per_step(times, "scheduler")
                figures[f"{name}_worker_us"] = per_step(times, "worker")
            out[clients] = figures
            print(kind, clients, figures, flush=True)
        # Every request ended; the never-decoded ones' blocks are freed once leases end.
        time.sleep(LEASE_SECONDS + 10)
        out[0] = {"prefill_kv": prefill.kv_usage(), "decode_kv": decode.kv_usage()}
    finally:
        decode.stop()
        prefill.stop()
    return out


def main() -> None:
    logs = Path(tempfile.mkdtemp(prefix="pdplan-load-"))
    model = write_model(logs / "tiny-llama")
    results = {kind: measure(kind, model, logs, 8300 + 200 * i)
               for i, kind in enumerate(("nixl", "pdplan"))}  # fmt: skip
    rows = []
    for clients in CONCURRENCY:
        n, p = results["nixl"][clients], results["pdplan"][clients]
        for key, label in (("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p99_ms", "TTFT p99 (ms)"),
                           ("tokens_per_s", "decode tokens/s"),
                           ("prefill_scheduler_us", "prefill, scheduler side (µs/step)"),
                           ("prefill_worker_us", "prefill, worker side (µs/step)"),
                           ("decode_scheduler_us", "decode, scheduler side (µs/step)"),
                           ("decode_worker_us", "decode, worker side (µs/step)")):  # fmt: skip
            rows.append(f"| {clients} | {label} | {n[key]:.1f} | {p[key]:.1f} | "
                        f"{p[key] / n[key]:.2f} |")  # fmt: skip
        counts = [f"{r['done']} / {r['aborted']} / {r['never_decoded']} / {r['short']}"
                  for r in (n, p)]  # fmt: skip
        rows.append(f"| {clients} | requests done / aborted / never decoded / short | "
                    f"{counts[0]} | {counts[1]} | |")  # fmt: skip
    n0, p0 = results["nixl"][0], results["pdplan"][0]
    rows.append(f"| all | KV cache in use after the runs and leases, prefill / decode | "
                f"{n0['prefill_kv']:.4f} / {n0['decode_kv']:.4f} | "
                f"{p0['prefill_kv']:.4f} / {p0['decode_kv']:.4f} | |")  # fmt: skip
    table = "\n".join([
        f"{' and '.join(map(str, CONCURRENCY))} clients at once, each run twice as many "
        f"requests: prompts of {PROMPT_TOKENS[0]}-{PROMPT_TOKENS[1]} tokens and "
        f"{DECODE_TOKENS[0]}-{DECODE_TOKENS[1]} decode tokens drawn per request (the same draws "
        f"for both connectors); one in {ABORT_AFTER_FIRST} aborted by its client after its "
        f"first token, one in {NEVER_DECODED} never sent to the decode server. Prefill and "
        "decode `vllm.entrypoints.openai.api_server` at TP 1 on this 2-core CPU (tiny fp32 "
        "Llama, block 32, vLLM 0.32 CPU backend), both connectors through NIXL 1.5.1 (UCX, "
        "loopback) with their defaults, NixlConnector's instances first. TTFT: at the client, "
        "from sending the prefill request to the first streamed decode token. Connector time: "
        "the hooks vLLM calls on each side, summed per engine step (benches/serve_timed.py). "
        f"KV in use: `vllm:kv_cache_usage_perc` once every request ended and {LEASE_SECONDS} s "
        "leases ran out (0 = no block leaked).",
        "",
        "| clients | figure | NixlConnector | PdplanConnector | ratio |",
        "| --- | --- | --- | --- | --- |",
        *rows,
    ])  # fmt: skip
    write("vllm_load.md", table)
    print(table)


if __name__ == "__main__":
    threading.stack_size(1 << 20)
    main()

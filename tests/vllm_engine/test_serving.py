"""The "Serving with vLLM" guide, run as written: its prefill server, decode server (TP 2)
and proxy commands started as processes with ``MODEL`` set to the tiny model, then requests
through the proxy's OpenAI API. The oracle: the tokens one vLLM instance alone decodes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from harness import LENGTHS, MAX_TOKENS, hostile_client, prompts_of

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs/guides/serving-vllm.md"


def guide_command(name: str) -> str:
    """The bash block after ``<!-- serve:NAME -->`` in the guide, continuation lines joined."""
    text = GUIDE.read_text(encoding="utf-8")
    found = re.search(rf"<!-- serve:{name} -->\n```bash\n(.*?)```", text, re.S)
    assert found, f"the guide has no serve:{name} block"
    return found.group(1).replace("\\\n", " ").strip()


#: The guide's prefill side channel, block size, and the tiny model's KV bytes a token (2
#: layers x K and V x 2 KV heads x 64 dims x 4 bytes: harness.write_model's Llama in float32).
SIDE_CHANNEL_PORT = 5600
BLOCK_SIZE = 32
TOKEN_BYTES = 2 * 2 * 2 * 64 * 4
#: The guide's decode server's TP size, and the tokens of its client prompt.
DECODE_TP = 2
CLIENT_PROMPT_TOKENS = 6


def metric_values(url: str, name: str) -> dict[str, float]:
    """Each sample of a metric on ``url``'s ``/metrics`` whose name starts ``name``, summed
    over the engine labels and keyed by name and its other labels (``cause``)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        found = re.match(r"^([\w:]+)(?:\{(.*)\})? ([-+\w.]+)$", line)
        if not found or not found.group(1).startswith(name):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group(2) or ""))
        key = found.group(1) + ("{" + f'cause="{labels["cause"]}"' + "}" if "cause" in labels
                                else "")  # fmt: skip
        out[key] = out.get(key, 0.0) + float(found.group(3))
    return out


def metrics_until(
    url: str, expected: dict[str, float], seconds: float = 30, at_least: bool = False
) -> dict[str, float]:
    """The metrics named in ``expected`` once they equal it (or, ``at_least``, reach it: vLLM
    exports a step's counts after the step), or as they stand after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        seen = {}
        for name in expected:
            seen.update(metric_values(url, name.split("{")[0]))
        seen = {name: seen.get(name, 0.0) for name in expected}
        reached = all(seen[k] >= v for k, v in expected.items()) if at_least else seen == expected
        if reached or time.monotonic() > deadline:
            return seen
        time.sleep(1)


def wait_healthy(url: str, process: subprocess.Popen[bytes], seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{url} exited with {process.returncode}"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not come up in {seconds} s")


def complete(port: int, model: Path, prompt: list[int]) -> list[int]:
    """The tokens a proxy's OpenAI completion of ``prompt`` decodes."""
    body = {"model": str(model), "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=300) as response:
        tokens: list[int] = json.loads(response.read())["choices"][0]["token_ids"]
    return tokens


def test_the_guide_s_servers_and_proxy_decode_what_one_instance_decodes(
    model: Path, logs: Path, reference: dict[tuple[int, ...], list[int]]
) -> None:
    # The guide's own model block writes $MODEL: the same tiny model (same seed) the
    # reference tokens come from, or they differ.
    guide_model = logs / "guide-model" / model.name
    env = {**os.environ, "MODEL": str(guide_model)}
    subprocess.run(["bash", "-c", guide_command("model")], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    assert (guide_model / "config.json").is_file()
    processes: list[subprocess.Popen[bytes]] = []
    files = []

    def start(name: str) -> subprocess.Popen[bytes]:
        files.append(open(logs / f"serve-{name}.log", "wb"))
        command = ["bash", "-c", guide_command(name)]
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=files[-1],
                                   stderr=subprocess.STDOUT)  # fmt: skip
        processes.append(process)
        return process

    try:
        wait_healthy("http://127.0.0.1:8100", start("prefill"))
        # A hostile client first: the prefill rank refuses it all and serves on.
        refused = hostile_client(SIDE_CHANNEL_PORT)
        wait_healthy("http://127.0.0.1:8200", start("decode"))
        proxy = start("proxy")
        # The proxy says where it listens (the first thing a new user looks for).
        listening = "proxy listening on http://127.0.0.1:8000"
        deadline = time.monotonic() + 60
        while listening not in (logs / "serve-proxy.log").read_text(errors="replace"):
            assert proxy.poll() is None and time.monotonic() < deadline, "the proxy never listened"
            time.sleep(0.2)
        client = subprocess.run(["bash", "-c", guide_command("client")], cwd=ROOT, env=env,
                                capture_output=True, check=True, timeout=300)  # fmt: skip
        assert json.loads(client.stdout)["choices"][0]["token_ids"]
        lengths = [CLIENT_PROMPT_TOKENS, *LENGTHS]
        for prompt in prompts_of(LENGTHS):
            assert complete(8000, guide_model, prompt) == reference[tuple(prompt)]
        # Every request's pages, read by the decode ranks together (each its KV heads), and
        # each request counted by each decode rank.
        pages = sum(-(-n // BLOCK_SIZE) for n in lengths)
        expected = {"vllm:pdplan_requests_read_total": len(lengths) * DECODE_TP,
                    "vllm:pdplan_bytes_read_total": pages * BLOCK_SIZE * TOKEN_BYTES}  # fmt: skip
        assert metrics_until("http://127.0.0.1:8200", expected) == expected
        # Each hostile request was refused and counted by its cause; more are (libzmq reads a
        # raw connection's random bytes as ZMTP 1.0 frames, which reach the server too).
        refusals = {f'vllm:pdplan_refused_side_channel_requests_total{{cause="{cause}"}}': n
                    for cause, n in refused.items()}  # fmt: skip
        counted = metrics_until("http://127.0.0.1:8100", refusals, at_least=True)
        assert all(counted[k] >= n for k, n in refusals.items()), (counted, refusals)
        assert not metric_values("http://127.0.0.1:8200", "vllm:pdplan_failed_requests_total")
        # One INFO line a request on each decode rank, naming its blocks and bytes: together
        # the bytes /metrics counted.
        decode_log = (logs / "serve-decode.log").read_text(errors="replace")
        lines = re.findall(r"pdplan: request (\S+) read ([0-9]+) blocks \(([0-9]+) bytes\)",
                           decode_log)  # fmt: skip
        assert len(lines) == len(lengths) * DECODE_TP, lines
        assert sum(int(moved) for *_, moved in lines) == expected["vllm:pdplan_bytes_read_total"]
        # The guide's prefill server of two DP ranks, through its own proxy to the same decode
        # server: each DP rank on its own ports, each request read from its own.
        wait_healthy("http://127.0.0.1:8300", start("prefill-dp"))
        proxy_dp = start("proxy-dp")
        while "proxy listening on http://127.0.0.1:8001" not in (
            logs / "serve-proxy-dp.log"
        ).read_text(errors="replace"):
            assert proxy_dp.poll() is None, "the DP proxy never listened"
            time.sleep(0.2)
        through_dp = prompts_of(tuple(range(8, 120, 11)), salt=5)  # new to the decode side
        with ThreadPoolExecutor(len(through_dp)) as pool:  # at once: the ranks share them
            answers = list(pool.map(lambda p: complete(8001, guide_model, p), through_dp))
        assert answers == [reference[tuple(p)] for p in through_dp]
        decode_log = (logs / "serve-decode.log").read_text(errors="replace")
        ports = set(re.findall(r"pdplan: request \S+ read .* from 127\.0\.0\.1:(58\d\d)",
                               decode_log))  # fmt: skip
        assert ports == {"5800", "5801"}, ports
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        for file in files:
            file.close()
